"""Whether anyone consumes a job queue: the consumers' heartbeats, read back.

A job submitted while no ``serving-core worker`` takes from its queue (none
runs, or one was started with another ``SERVING_HANDLER``, so it consumes
another queue) stays ``queued`` for ever. Two things make that visible:

- ``GET /jobs/<id>`` of a queued job adds a ``hint`` when no consumer has
  polled the queue within ``SERVING_JOBS_LEASE_S`` (the time after which a
  quiet consumer's jobs are handed to another one: it counts as gone);
- the app's ``/metrics`` adds, per queue it serves, read from the store at
  each scrape: ``serving_job_consumers`` (consumers heard from within that
  window), ``serving_job_queue_unpolled_seconds`` (since the latest heartbeat,
  ``+Inf`` when none is kept) and ``serving_job_queue_depth``. An alert on
  ``serving_job_queue_depth > 0 and serving_job_consumers == 0`` catches it.

They are read at scrape time rather than kept in the workers' metric files:
they are facts about the shared store, the same whichever worker answers.
Imports no Flask.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

from serving_core.jobs import backends
from serving_core.jobs.base import JobQueue, QueueUnavailable
from serving_core.settings import Settings

log = logging.getLogger("serving_core.jobs.liveness")
_logged: set[str] = set()  # the queues whose missing worker this process has logged


def hint(queue: JobQueue, settings: Settings, *, handler: str | None) -> str | None:
    """What to tell the owner of a queued job when nobody consumes ``queue``; None
    while a consumer is live (or the store cannot say). ``handler``: the
    ``SERVING_HANDLER`` a worker for this queue takes, when this server knows it."""
    try:
        seen = queue.consumers(settings.jobs_lease_s)
    except QueueUnavailable:
        return None  # the job itself was just read; a missing hint is no error
    if seen.live:
        return None
    quiet = f"no serving-core worker has taken jobs from queue {queue.queue!r}"
    if seen.last_seen is not None:
        quiet += f" for {max(0.0, time.time() - seen.last_seen):.0f} s"
    store = backends.backend_for(settings.jobs_url).SHARED
    # The client reads the hint; the paths are for the operator's log (once per
    # queue and process, however often clients poll), since a client has no
    # business knowing how the server is laid out.
    if queue.queue not in _logged:
        _logged.add(queue.queue)
        log.info(
            "queue %r is not consumed: a worker needs SERVING_HANDLER=%s and this server's %s%s",
            queue.queue,
            handler or f"<the handler named {queue.queue!r}>",
            store,
            f"={settings.jobs_path}" if store == "SERVING_JOBS_PATH" else "",  # a URL: secret
        )
    return (
        f"{quiet}, so this job waits: start serving-core worker with this server's "
        f"SERVING_HANDLER and {store} (a worker takes from the queue named after its "
        "handler; the server's log names both)"
    )


class QueueCollector:
    """A prometheus-client collector of the gauges above, for ``queues``."""

    def __init__(self, queues: Sequence[JobQueue], window_s: float) -> None:
        self.queues = queues
        self.window_s = window_s

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        consumers = GaugeMetricFamily(
            "serving_job_consumers",
            "`serving-core worker` consumers that took from (or renewed leases on) the job "
            "queue within SERVING_JOBS_LEASE_S; 0 with jobs queued means they wait for ever.",
            labels=["queue"],
        )
        unpolled = GaugeMetricFamily(
            "serving_job_queue_unpolled_seconds",
            "Seconds since a consumer last took from the job queue (a live one records it "
            "every 5 s); +Inf when none has within SERVING_JOBS_TTL_S.",
            labels=["queue"],
        )
        depth = GaugeMetricFamily(
            "serving_job_queue_depth",
            "Jobs queued or running in the job queue.",
            labels=["queue"],
        )
        now = time.time()
        for queue in self.queues:
            try:
                seen = queue.consumers(self.window_s)
                jobs = queue.depth()
            except QueueUnavailable as error:
                # A scrape still answers: the store's absence shows as missing series.
                log.warning("/metrics: the job queue %r did not answer: %s", queue.queue, error)
                continue
            age = math.inf if seen.last_seen is None else max(0.0, now - seen.last_seen)
            consumers.add_metric([queue.queue], seen.live)
            unpolled.add_metric([queue.queue], age)
            depth.add_metric([queue.queue], jobs)
        yield from (consumers, unpolled, depth)


def exposition(queues: Sequence[JobQueue], window_s: float) -> bytes:
    """The gauges of ``queues`` in Prometheus text, to append to the app's /metrics."""
    if not queues:
        return b""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(queues, window_s))
    return bytes(generate_latest(registry))
