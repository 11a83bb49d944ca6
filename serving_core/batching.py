"""The per-worker batcher: one model thread that owns every call into the handler.

Request threads ``submit`` prepared items with their context (id, deadline)
and wait on a future; the model thread forms batches (when, decided by a
dispatch policy), drops items whose deadline has passed before they reach the
handler, runs the batch through the engine and resolves each future. It is
ours rather than a library's because batching, admission and the handler
contract are the product. Imports no Flask.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from .context import Context
from .dispatch import Policy
from .engine import Ran
from .errors import DeadlineExceeded, ModelError, NotReady, Overloaded

log = logging.getLogger("serving_core.batching")

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


class _NoObserver:
    def batch(self, size: int, duration_s: float, queue_waits_s: Sequence[float]) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass

    def depth(self, depth: int) -> None:
        pass


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
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        # What a request waits on; the gevent worker swaps in futures its
        # greenlets can wait on (``greenworker.GreenFuture``).
        self.new_future: Callable[[], Future[Any]] = Future

    # -- request threads ---------------------------------------------------

    def submit(self, item: Any, context: Context, *, arrival: float) -> Pending:
        """Queue ``item``; raises ``Overloaded`` at once when it cannot be served in time."""
        deadline = context.deadline if context.deadline is not None else float("inf")
        with self._cond:
            if self._stopping or not self._thread.is_alive():
                raise NotReady("this worker is shutting down; retry on another instance")
            now = self._clock()
            depth = len(self._queue)
            if depth >= self.max_queue:
                self._observer.rejected("queue_full")
                raise Overloaded(
                    f"the queue is full ({depth} requests); retry after the Retry-After delay",
                    reason="queue_full",
                    retry_after_s=self.policy.drain_time_s(depth, self._busy_left(now)),
                )
            late = self.policy.predicted_late(
                depth, self._busy_left(now), deadline=deadline, now=now
            )
            if late is not None:
                self._observer.rejected("predicted_late")
                raise Overloaded(
                    "the server cannot answer before this request's deadline "
                    f"({depth} requests queued); retry after the Retry-After delay",
                    reason="predicted_late",
                    retry_after_s=late,
                )
            pending = Pending(item, context, arrival, enqueued=now, future=self.new_future())
            self._queue.append(pending)
            self.policy.arrived(now)
            self._observer.depth(len(self._queue))
            self._cond.notify()
        return pending

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Refuse new items, finish the queued ones, stop the thread; True if it stopped."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def rejected(self, reason: str) -> None:
        """Count a request refused before it reached the queue."""
        self._observer.rejected(reason)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def depth(self) -> int:
        return len(self._queue)

    def _busy_left(self, now: float) -> float:
        return max(0.0, self._busy_until - now)

    # -- the model thread ---------------------------------------------------

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run(batch)
            except Exception:
                # A bug outside the handler (an observer, say) must not kill the
                # model thread: every later request would wait for its deadline.
                log.exception("the batcher failed around a batch of %d", len(batch))
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(
                            ModelError(f"internal error; request id {pending.request_id}")
                        )
            finally:
                with self._cond:
                    self._busy_until = 0.0

    def _next_batch(self) -> list[Pending] | None:
        with self._cond:
            while True:
                if not self._queue:
                    if self._stopping:
                        return None
                    self._cond.wait()
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
            self._observer.depth(len(self._queue))
            return batch

    def _run(self, batch: list[Pending]) -> None:
        now = self._clock()
        live: list[Pending] = []
        for pending in batch:
            if not pending.future.set_running_or_notify_cancel():
                continue  # its request thread gave up at the deadline
            if pending.deadline <= now:
                pending.future.set_exception(DeadlineExceeded(_deadline_message(pending)))
                self._observer.rejected("deadline_passed")
                continue
            live.append(pending)
        if live:
            started = self._clock()
            ran = self._run_batch([p.item for p in live], [p.context for p in live])
            duration = self._clock() - started
            for pending, result in zip(live, ran.results, strict=True):
                if isinstance(result, BaseException):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(result)
            # Re-runs in halves (an InvalidInput to isolate) are not one batch of
            # this size: their total time would skew the cost model, so only a
            # batch that ran in one call teaches it.
            if ran.calls == 1:
                self.policy.observe(len(live), duration)
            self._observer.batch(len(live), duration, [started - p.arrival for p in live])


def _deadline_message(pending: Pending) -> str:
    return (
        f"request {pending.request_id} waited past its deadline before the model could run it; "
        "retry later or raise SERVING_REQUEST_TIMEOUT_S"
    )
