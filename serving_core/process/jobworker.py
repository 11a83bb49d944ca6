"""``serving-core worker``: the handler over the job queue, in batches, preloaded like ``serve``.

    master    ``prefork.Prefork``: preload, fork SERVING_WORKERS consumers, fork again
              one that dies; /metrics and /healthz on SERVING_BIND
    consumer  setup_worker(), torch threads = cores // workers, open the queue,
              then: take up to SERVING_MAX_BATCH_SIZE jobs → one Engine call
              → complete or fail each job

SIGTERM (or SIGINT) asks every consumer to stop: a consumer finishes the
batch in hand and exits; jobs it holds but has not started go back to the
queue at once. A consumer killed outright loses nothing either: its leased
jobs are handed out again when their lease runs out (at-least-once).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from serving_core.context import Context
from serving_core.engine.core import Engine, Result
from serving_core.errors import ServingError
from serving_core.jobs.backends import open_queue
from serving_core.jobs.base import Job, JobQueue
from serving_core.process.leases import LeaseRenewer
from serving_core.process.prefork import Prefork
from serving_core.threads import held

TAKE_WAIT_S = 1.0  # how long a take blocks: the longest a stop request waits to be seen


@dataclass
class Consumer:
    """One process's loop: take a batch, run it, store what came out."""

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
        contexts = [Context(job.id) for job in jobs]
        with self._renewing(jobs):
            try:
                results = self.engine.predict_many([job.params for job in jobs], contexts)
            except BaseException:
                # Not the handler's error (those are per job): hand the batch back untouched.
                self.queue.release(jobs)
                raise
            if len(jobs) > 1:
                results = self._isolate(jobs, contexts, results)
        finished: list[tuple[Job, Result]] = []
        failed = 0
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, ServingError):
                self.queue.fail(job, result.body()["error"], retry=result.status >= 500)
                failed += 1
            else:
                finished.append((job, result))
        # The whole batch's results in one commit (SQLite) or round trip (Redis): a
        # commit per job cost about 5% of MiniLM's jobs/s.
        self.queue.complete_many(finished)
        self.observer(len(finished), failed)

    @contextlib.contextmanager
    def _renewing(self, jobs: list[Job]) -> Iterator[None]:
        if self._renewer is None:
            yield
        else:
            with self._renewer.renewing(jobs):
                yield

    def _isolate(
        self, jobs: list[Job], contexts: list[Context], results: list[Result]
    ) -> list[Result]:
        """A model failure fails every job of its batch; run those jobs again one at a
        time, so that one poison job fails alone and its batch-mates are not retried
        with it until they become dead letters too."""
        failed = [
            i for i, r in enumerate(results) if isinstance(r, ServingError) and r.status >= 500
        ]
        if len(failed) < 2:
            return results
        results = list(results)
        for i in failed:
            results[i] = self.engine.predict_many([jobs[i].params], [contexts[i]])[0]
        return results


def _waited(job: Job) -> float:
    """Seconds from submission to this attempt's start (both stamped by the queue)."""
    return max(0.0, (job.started_at or job.created_at) - job.created_at)


class Master(Prefork):
    """``serving-core worker``: consumers of the handler's job queue."""

    command = "serving-core worker"

    def describe(self) -> str:
        name = self.loaded.handler.name or type(self.loaded.handler).__name__.lower()
        return f"{self.command}: {self.settings.workers} consumer(s) of queue {name!r}"

    def consume(self, slot: int, stopping: dict[str, bool]) -> int:
        engine, metrics = self.consumer_engine()
        queue = open_queue(self.settings, engine.name, consumer=True)
        try:
            Consumer(
                engine,
                queue,
                name=self.consumer_name(),
                max_batch_size=engine.max_batch_size,
                stopping=lambda: stopping["asked"],
                observer=metrics.jobs_finished,
                on_taken=metrics.jobs_taken,
                lease_s=self.settings.jobs_lease_s,
            ).run()
        finally:
            queue.close()
        return 0
