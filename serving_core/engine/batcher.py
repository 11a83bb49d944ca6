"""The per-worker batcher: one model thread that owns every call into the handler.

Request threads ``submit`` prepared items with their context (id, deadline)
and wait on a future; the model thread forms batches (when, decided by a
dispatch policy), drops items whose deadline has passed before they reach the
handler, runs the batch through the engine and resolves each future. It is
ours rather than a library's because batching, admission and the handler
contract are the product. Imports no Flask.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

from serving_core.context import Context
from serving_core.engine.core import Ran
from serving_core.engine.policy import Policy
from serving_core.errors import DeadlineExceeded, ModelError, NotReady, Overloaded

log = logging.getLogger("serving_core.engine.batcher")

Clock = Callable[[], float]
# ``Engine.run``: a result (or a ServingError) per item, and the handler calls it took.
RunBatch = Callable[[Sequence[Any], Sequence[Context]], Ran]


@dataclass(eq=False)
class Pending:
    """One request waiting for the model thread."""

    item: Any
    context: Context  # its id, and the monotonic deadline after which the answer is useless
    arrival: float  # monotonic seconds, when the request reached the server
    enqueued: float = 0.0
    future: Future[Any] = field(default_factory=Future)
    batch_size: int = 0  # the size of the batch that ran it, once it ran (for the log)

    @property
    def request_id(self) -> str:
        return self.context.request_id

    @property
    def deadline(self) -> float:
        return self.context.deadline if self.context.deadline is not None else float("inf")


class Observer(Protocol):
    """Receives what the batcher does; metrics implement it."""

    def batch(self, size: int, duration_s: float, queue_waits_s: Sequence[float]) -> None: ...

    def rejected(self, reason: str) -> None: ...

    def depth(self, depth: int) -> None: ...

    def flush(self) -> None:
        """Write what was added up."""
        ...

    def flush_in(self) -> float | None:
        """Seconds until what was added up is due to be written; None: nothing is."""
        ...


class _NoObserver:
    def batch(self, size: int, duration_s: float, queue_waits_s: Sequence[float]) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass

    def depth(self, depth: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def flush_in(self) -> float | None:
        return None


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
        self._run_batch = run_batch
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self._observer: Observer = observer or _NoObserver()
        self._clock = clock
        self._queue: deque[Pending] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy_until = 0.0  # predicted end of the batch in flight (0: idle)
        self._running: list[Pending] = []  # the batch the handler has now
        self._running_since = 0.0
        # Why this worker must be replaced now (its model thread hung or died:
        # nothing queued will run), or once it has finished its queue (the
        # handler raised SystemExit, say). Read by the watchdog.
        self.fault: str | None = None
        self.recycle: str | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        # What a request waits on; the gevent runtime swaps in futures its
        # greenlets can wait on (``process.workers.greenfuture.GreenFuture``).
        self.new_future: Callable[[], Future[Any]] = Future
        # How a submit wakes the model thread. None: at once, by each submit. The
        # gevent worker passes its hub's ``run_callback``: every request of one
        # turn of the hub's loop is queued first, then one wake-up tells the model
        # thread about all of them. A wake-up per request cost a futex call and a
        # GIL hand-over each (the echo's largest cost), and the adaptive policy,
        # waiting for more, was woken only to wait again.
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
            self._observer.depth(len(self._queue))
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
        depth = len(self._queue)
        if depth >= self.max_queue:
            self._observer.rejected("queue_full")
            raise Overloaded(
                f"the queue is full ({depth} requests); retry after the Retry-After delay",
                reason="queue_full",
                retry_after_s=self.policy.drain_time_s(depth, self._busy_left(now)),
            )
        late = self.policy.predicted_late(depth, self._busy_left(now), deadline=deadline, now=now)
        if late is not None:
            self._observer.rejected("predicted_late")
            raise Overloaded(
                "the server cannot answer before this request's deadline "
                f"({depth} requests queued); retry after the Retry-After delay",
                reason="predicted_late",
                retry_after_s=late,
            )

    def withdraw(self, pending: Pending) -> None:
        """The request gave up (its deadline passed): its item leaves the queue at once,
        so a batch that never ends does not leave the queue full of the dead."""
        with self._cond:
            if pending.future.cancel():
                with contextlib.suppress(ValueError):  # already taken for a batch
                    self._queue.remove(pending)
                self._observer.depth(len(self._queue))

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
            dropped = [*self._queue, *self._running]
            self._queue.clear()
            self._observer.depth(0)
            self._cond.notify_all()
        for pending in dropped:
            _resolve(
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
    def depth(self) -> int:
        return len(self._queue)

    def _busy_left(self, now: float) -> float:
        return max(0.0, self._busy_until - now)

    # -- the model thread ---------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    self._flush()
                    return
                if batch:
                    self._run_guarded(batch)
                else:
                    self._flush()  # idle, and the observer's sums are due
        except BaseException as exc:
            # Forming batches failed (a dispatch policy's bug, say): the thread cannot
            # go on safely. Say so, fail what is queued now, and let the watchdog
            # replace the worker instead of answering 503 forever.
            log.critical("the model thread failed and stops: %r", exc, exc_info=exc)
            self.abandon(f"the model thread failed: {exc!r}")

    def _run_guarded(self, batch: list[Pending]) -> None:
        try:
            self._run(batch)
        except Exception:
            # A bug outside the handler (an observer, say) must not kill the
            # model thread: every later request would wait for its deadline.
            log.exception("the batcher failed around a batch of %d", len(batch))
            self._fail(batch, "internal error")
        except BaseException as exc:
            # SystemExit (or KeyboardInterrupt) out of the handler: this batch fails,
            # the thread serves what is queued, and the worker is replaced after,
            # since the handler asked to stop or is in a state nobody knows.
            ids = ", ".join(p.request_id for p in batch)
            log.error(
                "the handler raised %r on a batch of %d (request ids: %s); "
                "this worker will be replaced",
                exc,
                len(batch),
                ids,
                exc_info=exc,
            )
            self._fail(batch, "the model failed on this request")
            self.recycle = f"the handler raised {type(exc).__name__}"
        finally:
            with self._cond:
                self._busy_until = 0.0
                self._running = []
                self.policy.answered(self._clock())

    def _flush(self) -> None:
        try:
            self._observer.flush()
        except Exception:
            log.exception("the batcher's observer failed to flush")

    def _fail(self, batch: list[Pending], what: str) -> None:
        for pending in batch:
            _resolve(pending.future, ModelError(f"{what}; request id {pending.request_id}"))

    def _next_batch(self) -> list[Pending] | None:
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
                now = self._clock()
                if len(self._queue) >= self.max_batch_size or self._stopping:
                    break
                at = self.policy.dispatch_at(self._queue, now)
                if at <= now:
                    break
                self._cond.wait(at - now)
            size = min(len(self._queue), self.max_batch_size)
            batch = [self._queue.popleft() for _ in range(size)]
            self._busy_until = now + self.policy.batch_cost_s(size)
            self._running = batch
            self._running_since = now
            self._observer.depth(len(self._queue))
            return batch

    def _run(self, batch: list[Pending]) -> None:
        now = self._clock()
        live: list[Pending] = []
        for pending in batch:
            if not pending.future.set_running_or_notify_cancel():
                continue  # its request thread gave up at the deadline
            if pending.deadline <= now:
                _resolve(pending.future, DeadlineExceeded(_deadline_message(pending)))
                self._observer.rejected("deadline_passed")
                continue
            live.append(pending)
        if live:
            started = self._clock()
            ran = self._run_batch([p.item for p in live], [p.context for p in live])
            duration = self._clock() - started
            for pending, result in zip(live, ran.results, strict=True):
                pending.batch_size = len(live)
                _resolve(pending.future, result)
            # Re-runs in halves (an InvalidInput to isolate) are not one batch of
            # this size: their total time would skew the cost model, so only a
            # batch that ran in one call teaches it.
            if ran.calls == 1:
                self.policy.observe(len(live), duration)
            self._observer.batch(len(live), duration, [started - p.arrival for p in live])


def _resolve(future: Future[Any], result: Any) -> None:
    """Set a result or an exception, unless the future is done already (failed by
    ``abandon`` while the model thread was away)."""
    if future.done():
        return
    with contextlib.suppress(InvalidStateError):
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)


def _deadline_message(pending: Pending) -> str:
    return (
        f"request {pending.request_id} waited past its deadline before the model could run it; "
        "retry later or raise SERVING_REQUEST_TIMEOUT_S"
    )
