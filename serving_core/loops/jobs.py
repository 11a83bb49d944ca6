"""A ``serving-core worker`` consumer's loop: take a batch of jobs, run it, store what came out.

    take up to SERVING_MAX_BATCH_SIZE jobs under a lease
    → one Engine call; a model failure's jobs run again alone (``isolation``)
    → complete or fail each job (a 5xx is retried until SERVING_JOBS_MAX_ATTEMPTS)

A stop request is seen between batches: the batch in hand is stored first.
The leases of a batch that runs long are renewed from one thread (``leases``).

Traced, each job runs under a ``job run`` span (a consumer's) whose parent is
the job's ``traceparent``, its submitter's span: from its batch's start to
its result stored. The engine's contexts carry those spans, so the batch's ``model`` span
links to every job in it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from serving_core.context import Context
from serving_core.engine.engine import Engine, Result
from serving_core.errors import ServingError
from serving_core.jobs.base import Job, JobQueue
from serving_core.loops.isolation import isolate
from serving_core.loops.leases import LeaseRenewer
from serving_core.threads import held
from serving_core.tracing.tracer import Span, tracer

TAKE_WAIT_S = 1.0  # how long a take blocks: the longest a stop request waits to be seen


@dataclass
class JobLoop:
    """A consumer's loop over a job queue: take a batch, run it, store what came out."""

    engine: Engine
    queue: JobQueue
    name: str
    max_batch_size: int
    stopping: Callable[[], bool]
    observer: Callable[[int, int], None] = field(default=lambda done, failed: None)
    # Each taken job's wait in the queue (submitted to started): the queue's lag.
    on_taken: Callable[[list[float]], None] = field(default=lambda waits: None)
    # SERVING_JOBS_LEASE_S: a batch running longer than a third of it renews its
    # jobs' leases (``leases.LeaseRenewer``). None: never.
    lease_s: float | None = None
    _renewer: LeaseRenewer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.lease_s is not None:
            self._renewer = LeaseRenewer(self.queue, self.name, self.lease_s)

    def run(self) -> None:
        try:
            while not self.stopping():
                jobs = self.queue.take(self.name, self.max_batch_size, TAKE_WAIT_S)
                if jobs:
                    self.on_taken([_waited(job) for job in jobs])
                    # Busy until the results are stored: a peer that borrowed this
                    # consumer's core in that gap would oversubscribe the next batch.
                    with held():
                        self.run_batch(jobs)
        finally:
            if self._renewer is not None:
                self._renewer.close()

    def run_batch(self, jobs: list[Job]) -> None:
        spans = _run_spans(jobs) if tracer().enabled else None
        try:
            self._run_batch(jobs, spans)
        except BaseException as exc:  # the batch went back to the queue unrun
            for span in spans or ():
                span.fail(exc)
            raise
        finally:
            for span in spans or ():
                span.end()

    def _run_batch(self, jobs: list[Job], spans: list[Span] | None) -> None:
        if spans is None:
            contexts = [Context(job.id) for job in jobs]
        else:
            pairs = zip(jobs, spans, strict=True)
            contexts = [Context(job.id, traceparent=span.traceparent) for job, span in pairs]
        params = [job.params for job in jobs]
        with self._renewing(jobs):
            try:
                results = self.engine.predict_many(params, contexts)
            except BaseException:
                # Not the handler's error (those are per job): hand the batch back untouched.
                self.queue.release(jobs)
                raise
            # Alone once, no more: the queue retries a job that fails again, counting
            # its attempts. Under two model failures, no batch failed as a whole.
            results, _ = isolate(self.engine, params, contexts, results, max_runs=2, min_failures=2)
        finished: list[tuple[Job, Result]] = []
        failed = 0
        for i, (job, result) in enumerate(zip(jobs, results, strict=True)):
            if isinstance(result, ServingError):
                self.queue.fail(job, result.body()["error"], retry=result.status >= 500)
                failed += 1
                if spans is not None:
                    spans[i].fail(result)
            else:
                finished.append((job, result))
        # The whole batch's results in one commit (SQLite) or one round trip (Redis),
        # not one per job.
        self.queue.complete_many(finished)
        self.observer(len(finished), failed)

    @contextlib.contextmanager
    def _renewing(self, jobs: list[Job]) -> Iterator[None]:
        if self._renewer is None:
            yield
        else:
            with self._renewer.renewing(jobs):
                yield


def _run_spans(jobs: list[Job]) -> list[Span]:
    """A ``job run`` span per job, each a child of its submitter's span (the job's
    ``traceparent``); a job queued untraced starts a trace of its own."""
    return [
        tracer().start(
            "job run",
            parent=job.traceparent or None,
            kind="consumer",
            attributes={
                "messaging.system": "serving-core",
                "messaging.destination.name": job.queue,
                "serving.job_id": job.id,
                "serving.job.attempt": job.attempts,
            },
        )
        for job in jobs
    ]


def _waited(job: Job) -> float:
    """Seconds from submission to this attempt's start (both stamped by the queue)."""
    return max(0.0, (job.started_at or job.created_at) - job.created_at)
