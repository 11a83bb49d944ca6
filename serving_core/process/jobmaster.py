"""``serving-core worker``: the handler over the job queue, in batches, preloaded like ``serve``.

    master    ``prefork.Prefork``: preload, fork SERVING_WORKERS consumers, fork again
              one that dies; /metrics and /healthz on SERVING_BIND
    consumer  setup_worker(), torch threads = cores // workers, its tracer, open the queue,
              then ``loops.jobs.JobLoop``: take up to SERVING_MAX_BATCH_SIZE jobs
              → one Engine call → complete or fail each job

SIGTERM (or SIGINT) asks every consumer to stop: a consumer finishes the
batch in hand and exits; jobs it holds but has not started go back to the
queue at once. A consumer killed outright loses nothing either: its leased
jobs are handed out again when their lease runs out (at-least-once).
"""

from __future__ import annotations

from serving_core.jobs.backends import open_queue
from serving_core.loops.jobs import JobLoop
from serving_core.process.prefork import Prefork


class JobMaster(Prefork):
    """``serving-core worker``'s master: its consumers run a ``JobLoop`` each."""

    command = "serving-core worker"

    def describe(self) -> str:
        name = self.loaded.handler.name or type(self.loaded.handler).__name__.lower()
        return f"{self.command}: {self.settings.workers} consumer(s) of queue {name!r}"

    def consume(self, slot: int, stopping: dict[str, bool]) -> int:
        engine, metrics = self.consumer_engine()
        queue = open_queue(self.settings, engine.name, consumer=True)
        try:
            JobLoop(
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
