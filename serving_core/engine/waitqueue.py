"""The batcher's queue: the items waiting for the model thread, and which of their
clients have hung up.

A hang-up only marks its item (``mark_gone``): the client watch reports it on the
gevent hub, and a storm hangs up a whole queue at once, so marking must be cheap.
The marked items leave at the next ``sweep``, which the batcher runs before it
refuses anyone and before it takes a batch. Not thread-safe: the batcher holds
its lock around every call. Imports no Flask.
"""

from __future__ import annotations

from collections import deque

from serving_core.engine.pending import Pending

# At most how often a refusal asks every queued client's socket whether it hung
# up (``peek``): a system call a socket, so a storm's refusals must not each pay it.
PEEK_EVERY_S = 0.005


class WaitQueue:
    def __init__(self) -> None:
        self.items: deque[Pending] = deque()
        # The marked items not yet swept out. A refusal sweeps only when this is
        # non-zero: a queue of live clients costs a refusal one integer check, and
        # a peek at most every PEEK_EVERY_S.
        self.gone = 0
        self.peeked_at = float("-inf")

    def __len__(self) -> int:
        """Every queued item, the gone ones not yet swept out included."""
        return len(self.items)

    @property
    def live(self) -> int:
        """The queued items whose clients still wait."""
        return len(self.items) - self.gone

    def append(self, pending: Pending) -> None:
        self.items.append(pending)

    def take(self, size: int) -> list[Pending]:
        return [self.items.popleft() for _ in range(size)]

    def mark_gone(self, pending: Pending) -> bool:
        """Mark a queued item whose client hung up; False if it is not queued (taken,
        withdrawn) or marked already."""
        if pending.gone or pending not in self.items:
            return False
        pending.gone = True
        self.gone += 1
        return True

    def remove(self, pending: Pending) -> None:
        """Take ``pending`` out; ValueError if it is not queued (taken for a batch)."""
        self.items.remove(pending)
        if pending.gone:
            self.gone -= 1

    def clear(self) -> list[Pending]:
        """Empty the queue; what was in it."""
        dropped = list(self.items)
        self.items.clear()
        self.gone = 0
        return dropped

    def peek(self, now: float) -> int:
        """Ask each queued client's connection whether it hung up; the gone now marked.
        The watch reports a hang-up a turn of the hub late, and not before an item
        has waited WATCH_AFTER_S, so a storm's last closed clients can still fill the
        queue when the next newcomer comes."""
        if now - self.peeked_at < PEEK_EVERY_S:
            return 0
        self.peeked_at = now
        for pending in self.items:
            if not pending.gone and pending.client_gone():
                pending.gone = True
                self.gone += 1
        return self.gone

    def sweep(self) -> int:
        """Drop the items whose clients hung up, cancelling their futures; how many."""
        live = deque(p for p in self.items if not p.gone)
        dropped = len(self.items) - len(live)
        if dropped:
            for pending in self.items:
                if pending.gone:
                    pending.future.cancel()  # its request greenlet ends, answering no one
            self.items = live
        self.gone = 0
        return dropped
