"""When to run a batch, and whether a new request can still be served in time.

Two policies share one cost model (``t(n) = a + b*n``, fitted per worker):

- ``FixedWindow``: wait until ``max_wait_ms`` after the first queued item
  arrived (one deadline, never reset), or until the batch is full.
- ``Adaptive``: run at once unless waiting for more items is predicted to raise
  throughput: more requests can still come, and they arrive closer together
  than the fixed cost of a batch that each one joining saves; never past any
  queued item's deadline nor ``max_wait_ms`` (counted from when the model was
  free to run them).

Both refuse a request at admission when its predicted completion (the batch in
flight, the queue ahead of it, its own batch) is later than its deadline.
Imports no Flask; time is passed in, so tests use a fake clock.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from serving_core.engine.costmodel import CostModel
from serving_core.engine.engine import Engine
from serving_core.settings import BatchPolicy, Settings


class QueuedItem(Protocol):
    @property
    def enqueued(self) -> float: ...

    @property
    def deadline(self) -> float: ...


class Policy:
    name = "base"

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_wait_s: float,
        cost: CostModel,
        open_connections: Callable[[], int | None] = lambda: None,
    ) -> None:
        """``open_connections``: the client connections that could still send a
        request (``None``: unknown); a policy may ignore it."""
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.cost = cost
        self._open_connections = open_connections

    def dispatch_at(self, queue: Sequence[QueuedItem], now: float) -> float:
        """Monotonic time at which to run what is queued; ``<= now`` means now."""
        raise NotImplementedError

    def arrived(self, now: float) -> None:
        """Called for every admitted request."""

    def answered(self, now: float) -> None:
        """Called when a batch has ended and its requests have their answers."""

    def observe(self, size: int, duration_s: float) -> None:
        self.cost.observe(size, duration_s)

    def batch_cost_s(self, size: int) -> float:
        return self.cost.predict(size)

    def completion_s(self, depth: int, busy_left_s: float) -> float:
        """Seconds until an item that finds ``depth`` items queued is answered."""
        full, rest = divmod(depth + 1, self.max_batch_size)
        return busy_left_s + full * self.cost.predict(self.max_batch_size) + self.cost.predict(rest)

    def drain_time_s(self, depth: int, busy_left_s: float) -> float:
        """Seconds until the queue ahead is served: the honest ``Retry-After``."""
        return self.completion_s(max(0, depth - 1), busy_left_s)

    def predicted_late(
        self, depth: int, busy_left_s: float, *, deadline: float, now: float
    ) -> float | None:
        """``None`` to admit; otherwise the seconds after which a retry could succeed."""
        if not self.cost.known:
            return None
        if now + self.completion_s(depth, busy_left_s) <= deadline:
            return None
        return self.drain_time_s(depth, busy_left_s)

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "max_batch_size": self.max_batch_size,
            "max_wait_ms": self.max_wait_s * 1000,
            "cost_model": self.cost.describe(),
        }


class FixedWindow(Policy):
    name = "fixed"

    def dispatch_at(self, queue: Sequence[QueuedItem], now: float) -> float:
        return queue[0].enqueued + self.max_wait_s


class ArrivalGaps:
    """The expected gap to the next arrival, from the median of the last gaps.

    The median, not a mean: closed-loop clients arrive in bursts (a batch's
    answers go out, its clients send again at once) separated by a batch's
    run time, and a mean of the gaps would call the burst slow and run its
    first request alone.
    """

    def __init__(self, window: int = 16) -> None:
        self._gaps: deque[float] = deque(maxlen=window)
        self._gap_s: float | None = None
        self._last: float | None = None

    def arrived(self, now: float) -> None:
        # Every request arrives here, on the worker's hub: the median is taken only
        # when a batch decision asks for it (``expected_gap_s``), not per arrival.
        if self._last is not None:
            self._gaps.append(max(0.0, now - self._last))
            self._gap_s = None
        self._last = now

    @property
    def last(self) -> float | None:
        return self._last

    def expected_gap_s(self, now: float, quiet_since: float | None = None) -> float:
        """Seconds to the next arrival, as far as the recent gaps tell; inf before two
        arrivals. ``quiet_since``: when the present silence began (the last arrival
        by default)."""
        if not self._gaps or self._last is None:
            return math.inf
        if self._gap_s is None:
            self._gap_s = statistics.median(self._gaps)
        # A silence longer than the usual gap is evidence of a lower rate: an
        # idle queue must never be held for arrivals that are not coming.
        return max(self._gap_s, now - (self._last if quiet_since is None else quiet_since))


class Adaptive(Policy):
    """Wait for another item only while that is predicted to raise throughput.

    One more item in this batch saves it a batch of its own, that is the
    fitted fixed cost ``a`` of a batch; waiting for it leaves the model idle
    for about the gap until it arrives. So the batch waits while (1) more
    requests can still come (with gunicorn, the worker's open connections
    outnumber the queued items: HTTP/1.1 carries one request per connection
    at a time), and (2) arrivals keep coming closer together than ``a``;
    never past ``max_wait_ms`` after the first item, nor so late that a
    queued item would miss its deadline.

    The end of a batch starts the clock again. While a batch runs, its
    clients cannot send (one request per connection at a time), so the queue
    that built up meanwhile, and the silence since its last arrival, say
    nothing about the rate; and the clients just answered are about to send
    again. Without this, closed-loop clients split into two halves that never
    meet: each batch ran the half that arrived during the other's run (MiniLM
    at c=32: batches of 8, against 14-16 with it, and 5% more requests/s).
    Likewise ``max_wait_ms`` counts from when the model was free to run the
    first item, not from its arrival: the wait is what the policy adds.
    """

    name = "adaptive"

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_wait_s: float,
        cost: CostModel,
        open_connections: Callable[[], int | None] = lambda: None,
    ) -> None:
        super().__init__(
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            cost=cost,
            open_connections=open_connections,
        )
        self.arrivals = ArrivalGaps()
        self._answered = -math.inf  # when the last batch ended

    def arrived(self, now: float) -> None:
        self.arrivals.arrived(now)

    def answered(self, now: float) -> None:
        self._answered = now

    def dispatch_at(self, queue: Sequence[QueuedItem], now: float) -> float:
        size = len(queue)
        if size >= self.max_batch_size or not self.cost.known:
            return now
        senders = self._open_connections()
        if senders is not None and senders <= size:
            return now  # every client that could send has sent
        saved_s = self.cost.intercept_s
        last = self.arrivals.last if self.arrivals.last is not None else now
        quiet_since = max(last, self._answered)
        if self.arrivals.expected_gap_s(now, quiet_since) >= saved_s:
            return now
        at = min(
            quiet_since + saved_s,
            max(queue[0].enqueued, self._answered) + self.max_wait_s,
            min(item.deadline for item in queue) - self.cost.predict(size + 1),
        )
        return max(now, at)


# The policies by SERVING_BATCH_POLICY's name. The names themselves are the
# settings' ``BatchPolicy`` (the contract layer imports no engine);
# tests/engine/test_policy.py checks that the two agree.
POLICIES: dict[BatchPolicy, type[Policy]] = {"adaptive": Adaptive, "fixed": FixedWindow}


def make_policy(
    name: BatchPolicy,
    *,
    max_batch_size: int,
    max_wait_ms: float,
    open_connections: Callable[[], int | None] = lambda: None,
) -> Policy:
    try:
        kind = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"no batch policy {name!r}: use one of {', '.join(sorted(POLICIES))}"
        ) from None
    return kind(
        max_batch_size=max_batch_size,
        max_wait_s=max_wait_ms / 1000,
        cost=CostModel(),
        open_connections=open_connections,
    )


def policy_for(
    settings: Settings, engine: Engine, *, open_connections: Callable[[], int | None]
) -> Policy:
    """The batching policy of a batcher over ``engine``: the worker's model thread and
    the shared model process build theirs here, so both follow the same settings."""
    return make_policy(
        settings.batch_policy,
        max_batch_size=engine.max_batch_size,
        # An unbatched handler runs one request at a time: waiting for a second gains nothing.
        max_wait_ms=settings.max_wait_ms if engine.batched else 0.0,
        open_connections=open_connections,
    )
