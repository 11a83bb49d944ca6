"""The per-worker batcher: a queue in front of one model thread that owns every call
into the handler.

Request threads ``submit`` prepared items with their context (id, deadline)
and wait on a future (``pending.Pending``), or are refused at once when they
cannot be served in time; the model thread (``modelthread``) takes the next
batch when the dispatch policy says, runs it through the engine and resolves
each future. It is ours rather than a library's because batching, admission
and the handler contract are the product. The queue, and the hung-up clients'
items in it, is ``waitqueue``. Imports no Flask.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from serving_core.context import Context
from serving_core.engine.modelthread import Clock, ModelThread, RunBatch
from serving_core.engine.observer import NoObserver, Observer
from serving_core.engine.pending import Pending, resolve
from serving_core.engine.policy import Policy
from serving_core.engine.waitqueue import WaitQueue
from serving_core.errors import NotReady, Overloaded


class Batcher:
    def __init__(
        self,
        run_batch: RunBatch,
        *,
        policy: Policy,
        max_batch_size: int,
        max_queue: int,
        observer: Observer | None = None,
        clock: Clock = time.monotonic,
        name: str = "serving-batcher",
    ) -> None:
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self._observer: Observer = observer or NoObserver()
        self._clock = clock
        self._queue = WaitQueue()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy_until = 0.0  # predicted end of the batch in flight (0: idle)
        self._running: list[Pending] = []  # the batch the handler has now
        self._running_since = 0.0
        # Why this worker must be replaced now (its model thread hung or died:
        # nothing queued will run). Read by the watchdog, as is ``recycle``.
        self.fault: str | None = None
        self._model = ModelThread(
            self, run_batch, policy=policy, observer=self._observer, clock=clock
        )
        self._thread = threading.Thread(target=self._model.run, name=name, daemon=True)
        # What a request waits on; the gevent runtime swaps in futures its
        # greenlets can wait on (``process.workers.greenfuture.GreenFuture``).
        self.new_future: Callable[[], Future[Any]] = Future
        # How a submit wakes the model thread. None: at once, by each submit. The
        # gevent worker passes its hub's ``run_callback``: every request of one
        # turn of the hub's loop is queued first, then one wake-up tells the model
        # thread about all of them. A wake-up per request costs a futex call and a
        # GIL hand-over each (the echo's largest cost), and wakes the adaptive
        # policy, waiting for more, only to wait again.
        self.defer_wake: Callable[[Callable[[], None]], object] | None = None
        self._wake_pending = False

    # -- request threads ---------------------------------------------------

    def admit(self, deadline: float) -> None:
        """Raise now what ``submit`` would raise for an item due by ``deadline``, and
        queue nothing: the app asks before it reads a request's body."""
        with self._cond:
            self._refuse(deadline, self._clock())

    def submit(self, item: Any, context: Context, *, arrival: float) -> Pending:
        """Queue ``item``; raises ``Overloaded`` at once when it cannot be served in time."""
        deadline = context.deadline if context.deadline is not None else float("inf")
        with self._cond:
            now = self._clock()
            self._refuse(deadline, now)
            pending = Pending(item, context, arrival, enqueued=now, future=self.new_future())
            self._queue.append(pending)
            self.policy.arrived(now)
            self._observer.depth(self.depth)
            if self.defer_wake is None or len(self._queue) >= self.max_batch_size > 1:
                # A full batch need not wait for the rest of the hub's turn, and its
                # items share the wake-up. (Items of an unbatched handler would each
                # pay one: they wait for the turn's end, when the model thread runs
                # them back to back.)
                self._cond.notify()
            elif not self._wake_pending:
                self._wake_pending = True
                self.defer_wake(self._wake)
        return pending

    def _wake(self) -> None:
        with self._cond:
            self._wake_pending = False
            self._cond.notify()

    def _refuse(self, deadline: float, now: float) -> None:
        """Raise if an item due by ``deadline`` cannot be queued now (holding the lock)."""
        if self.fault is not None:
            raise NotReady(
                "this worker's model stopped answering and the worker is being replaced; retry"
            )
        if self._stopping or not self._thread.is_alive():
            raise NotReady("this worker is shutting down; retry on another instance")
        refusal = self._refusal(deadline, now)
        queue = self._queue
        if refusal is not None and (queue.gone or queue.peek(now)) and self._sweep():
            refusal = self._refusal(deadline, now)  # decided again without the gone
        if refusal is not None:
            self._observer.rejected(refusal.reason)
            raise refusal

    def _refusal(self, deadline: float, now: float) -> Overloaded | None:
        depth = len(self._queue)
        if depth >= self.max_queue:
            return Overloaded(
                f"the queue is full ({depth} requests); retry after the Retry-After delay",
                reason="queue_full",
                retry_after_s=self.policy.drain_time_s(depth, self._busy_left(now)),
            )
        late = self.policy.predicted_late(depth, self._busy_left(now), deadline=deadline, now=now)
        if late is not None:
            return Overloaded(
                "the server cannot answer before this request's deadline "
                f"({depth} requests queued); retry after the Retry-After delay",
                reason="predicted_late",
                retry_after_s=late,
                # Late even on an idle model: the online service tells a client whose
                # own deadline this is that no retry meets it (finding F6).
                idle_late=self.policy.predicted_late(0, 0.0, deadline=deadline, now=now)
                is not None,
            )
        return None

    def _sweep(self) -> int:
        """Drop the queued items whose clients hung up (holding the lock); how many."""
        dropped = self._queue.sweep()
        if dropped:
            self._observer.depth(len(self._queue))
        return dropped

    def hung_up(self, pending: Pending) -> None:
        """The request's client has gone: its item no longer counts in ``depth``, and
        is dropped unrun at the next refusal (before deciding) or when the model
        thread reaches it. The client watch calls it on the hub as soon as it sees
        the hang-up, so it only marks (a storm hangs up a whole queue at once)."""
        with self._cond:
            if self._queue.mark_gone(pending):
                self._observer.depth(self.depth)

    def withdraw(self, pending: Pending) -> None:
        """The request gave up (its deadline passed): its item leaves the queue at once,
        so a batch that never ends does not leave the queue full of the dead."""
        with self._cond:
            if pending.future.cancel():
                with contextlib.suppress(ValueError):  # already taken for a batch
                    self._queue.remove(pending)
                self._observer.depth(self.depth)

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Refuse new items, finish the queued ones, stop the thread; True if it stopped.

        After ``abandon`` it does not wait: the model thread may never come back.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        joinable = self.fault is None and self._thread is not threading.current_thread()
        if joinable and self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def stalled(self, now: float, margin_s: float) -> str | None:
        """Why the model thread can no longer serve this worker, or None: it died, or
        its batch has run ``margin_s`` past the last deadline of its items."""
        with self._cond:
            if self.fault is not None:
                return self.fault
            if not self._thread.is_alive():
                if self._stopping or not self._thread.ident:
                    return None  # stopped on purpose, or never started
                return "the model thread has died"
            if not self._running:
                return None
            deadline = max(p.deadline for p in self._running)
            if now <= deadline + margin_s:
                return None
            return (
                f"a batch of {len(self._running)} has run {now - self._running_since:.1f} s, "
                f"{now - deadline:.1f} s past its deadline (request ids: "
                f"{', '.join(p.request_id for p in self._running)})"
            )

    def abandon(self, reason: str) -> None:
        """Give up on the model thread: refuse new items and fail every queued and
        running one now (503: another worker can serve them)."""
        with self._cond:
            self.fault = reason
            self._stopping = True
            dropped = [*self._queue.clear(), *self._running]
            self._observer.depth(0)
            self._cond.notify_all()
        for pending in dropped:
            resolve(
                pending.future,
                NotReady(
                    f"request {pending.request_id}: this worker's model stopped answering and "
                    "the worker is being replaced; retry"
                ),
            )

    def rejected(self, reason: str) -> None:
        """Count a request refused before it reached the queue."""
        self._observer.rejected(reason)

    @property
    def alive(self) -> bool:
        """Serving: the model thread runs, and nothing has asked for this worker's end."""
        return (
            self._thread.is_alive()
            and not self._stopping
            and self.fault is None
            and self.recycle is None
        )

    @property
    def recycle(self) -> str | None:
        """Why this worker must be replaced once it has finished its queue (the handler
        raised SystemExit, say); None while it may go on."""
        return self._model.recycle

    @property
    def depth(self) -> int:
        """The queued items whose clients still wait."""
        return self._queue.live

    def _busy_left(self, now: float) -> float:
        return max(0.0, self._busy_until - now)

    # -- the model thread (``modelthread.BatchSource``) -------------------------------

    def take(self) -> list[Pending] | None:
        """The next batch to run; [] when idle with the observer's sums due; None to stop."""
        with self._cond:
            while True:
                if not self._queue:
                    if self._stopping:
                        return None
                    # Idle: wake up when the observer's sums are due, if before work.
                    flush_in = self._observer.flush_in()
                    if flush_in is not None and flush_in <= 0:
                        return []
                    self._cond.wait(flush_in)
                    continue
                if self._queue.gone and self._sweep() and not self._queue:
                    continue  # nothing left but the gone: nothing to run for anyone
                now = self._clock()
                if len(self._queue) >= self.max_batch_size or self._stopping:
                    break
                at = self.policy.dispatch_at(self._queue.items, now)
                if at <= now:
                    break
                self._cond.wait(at - now)
            size = min(len(self._queue), self.max_batch_size)
            batch = self._queue.take(size)
            self._busy_until = now + self.policy.batch_cost_s(size)
            self._running = batch
            self._running_since = now
            self._observer.depth(self.depth)
            return batch

    def finished(self) -> None:
        with self._cond:
            self._busy_until = 0.0
            self._running = []
            self.policy.answered(self._clock())
