"""The model thread: every call into the handler, one batch at a time.

The ``Batcher`` decides when a batch forms (``BatchSource.take``); the model thread
runs it: drops the items whose deadline passed before they reached the
handler, runs the rest through the engine in one call, resolves each future,
and teaches the dispatch policy what the batch cost. A failure around a batch
fails that batch only; a failure to form batches gives the worker up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from serving_core.context import Context
from serving_core.engine.engine import Ran
from serving_core.engine.observer import Observer
from serving_core.engine.pending import Pending, resolve
from serving_core.engine.policy import Policy
from serving_core.errors import DeadlineExceeded, ModelError

log = logging.getLogger("serving_core.engine.modelthread")

Clock = Callable[[], float]
# ``Engine.run``: a result (or a ServingError) per item, and the handler calls it took.
RunBatch = Callable[[Sequence[Any], Sequence[Context]], Ran]


class BatchSource(Protocol):
    """Where the model thread takes its batches from: the batcher's queue."""

    def take(self) -> list[Pending] | None:
        """The next batch, once the policy says; [] when idle with the observer's sums
        due; None to stop."""
        ...

    def finished(self) -> None:
        """The batch taken last has ended, whichever way."""
        ...

    def abandon(self, reason: str) -> None:
        """Fail everything queued and refuse more: the model thread is stopping."""
        ...


class ModelThread:
    """What the model thread runs (``run``); the ``Batcher`` gives it a thread of its own."""

    def __init__(
        self,
        source: BatchSource,
        run_batch: RunBatch,
        *,
        policy: Policy,
        observer: Observer,
        clock: Clock,
    ) -> None:
        self._source = source
        self._run_batch = run_batch
        self._policy = policy
        self._observer = observer
        self._clock = clock
        # Why this worker must be replaced once it has finished its queue (the
        # handler raised SystemExit, say). Read by the watchdog, via the batcher.
        self.recycle: str | None = None

    def run(self) -> None:
        try:
            while True:
                batch = self._source.take()
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
            self._source.abandon(f"the model thread failed: {exc!r}")

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
            self._source.finished()

    def _flush(self) -> None:
        try:
            self._observer.flush()
        except Exception:
            log.exception("the batcher's observer failed to flush")

    def _fail(self, batch: list[Pending], what: str) -> None:
        for pending in batch:
            resolve(pending.future, ModelError(f"{what}; request id {pending.request_id}"))

    def _run(self, batch: list[Pending]) -> None:
        now = self._clock()
        live: list[Pending] = []
        for pending in batch:
            if not pending.future.set_running_or_notify_cancel():
                continue  # its request thread gave up at the deadline
            if pending.deadline <= now:
                resolve(pending.future, DeadlineExceeded(_deadline_message(pending)))
                self._observer.rejected("deadline_passed")
                continue
            live.append(pending)
        if live:
            started = self._clock()
            ran = self._run_batch([p.item for p in live], [p.context for p in live])
            duration = self._clock() - started
            for pending, result in zip(live, ran.results, strict=True):
                pending.batch_size = len(live)
                pending.started = started
                pending.batch_span = ran.span
                resolve(pending.future, result)
            # Re-runs in halves (an InvalidInput to isolate) are not one batch of
            # this size: their total time would skew the cost model, so only a
            # batch that ran in one call teaches it.
            if ran.calls == 1:
                self._policy.observe(len(live), duration)
            self._observer.batch(len(live), duration, [started - p.arrival for p in live])


def _deadline_message(pending: Pending) -> str:
    return (
        f"request {pending.request_id} waited past its deadline before the model could run it; "
        "retry later or raise SERVING_REQUEST_TIMEOUT_S"
    )
