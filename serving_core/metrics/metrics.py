"""The service's metrics: what they are, and how each event is counted.

The prometheus-client objects are made per ``Metrics`` (a registry each) and
imported lazily: ``directory.enable_multiprocess`` must run before the first
import of prometheus_client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from serving_core.handler import Handler, handler_name, model_revision
from serving_core.metrics import directory
from serving_core.metrics.generation import GenerationMetrics
from serving_core.metrics.tally import Tally

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Jobs wait from milliseconds (an idle worker) to hours (a backlog worked off slowly).
JOB_WAIT_BUCKETS_S = (
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0,
)  # fmt: skip


# The model thread's added-up observations (``Tally``) are written at most this
# long after they were made: by its next batch, or by the batcher when idle.
FLUSH_S = 0.25


class Metrics:
    """The service's metrics; implements the batcher's ``Observer``."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        # A registry per instance: tests build many apps in one process.
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "serving_requests_total",
            "HTTP requests answered, by route, status code and protocol "
            "(predict: serving-core's own JSON; v2: the Open Inference Protocol).",
            ["route", "status", "protocol"],
            registry=r,
        )
        self.latency = Histogram(
            "serving_request_duration_seconds",
            "Time from a request's arrival to its response, by route and protocol.",
            ["route", "protocol"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_wait = Histogram(
            "serving_queue_wait_seconds",
            "Time from a request's arrival to the start of the batch that ran it.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.batch_size = Histogram(
            "serving_batch_size",
            "Items per batch run by the handler.",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_duration = Histogram(
            "serving_batch_duration_seconds",
            "Time the handler took per batch.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_depth = Gauge(
            "serving_queue_depth",
            "Requests waiting for the model thread, summed over live workers.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.rejections = Counter(
            "serving_rejections_total",
            "Requests refused without running, by reason "
            "(queue_full, predicted_late, deadline_passed).",
            ["reason"],
            registry=r,
        )
        self.model_errors = Counter(
            "serving_model_errors_total",
            "Requests failed by an exception in the handler (500s).",
            registry=r,
        )
        self.cache_requests = Counter(
            "serving_cache_requests_total",
            "Cacheable requests, by how the inference cache answered them "
            "(hit, miss, coalesced: shared an identical request's model call).",
            ["result"],
            registry=r,
        )
        self.cache_errors = Counter(
            "serving_cache_errors_total",
            "Inference cache operations that failed and were answered as misses, by store.",
            ["store"],
            registry=r,
        )
        self.jobs = Counter(
            "serving_jobs_total",
            "Jobs `serving-core worker` finished, by result (done, failed: an attempt that "
            "failed; the job is retried until SERVING_JOBS_MAX_ATTEMPTS).",
            ["result"],
            registry=r,
        )
        self.job_wait = Histogram(
            "serving_job_wait_seconds",
            "How long each job waited in the job queue, from submission to the start of the "
            "attempt that took it: the queue's lag, as the worker sees it.",
            buckets=JOB_WAIT_BUCKETS_S,
            registry=r,
        )
        self.api_keys_file_errors = Gauge(
            "serving_api_keys_file_errors",
            "Lines of SERVING_API_KEYS_FILE that are not keys (1 when it cannot be read or "
            "holds no key), as the worker that saw most last read it; 0: the file is good.",
            multiprocess_mode="livemax",
            registry=r,
        )
        self.model = Gauge(
            "serving_model_info",
            "1 for the model a live process serves: its handler's name and version, and its "
            "revision (SERVING_MODEL_REVISION and the fetched artifacts'), so that a canary's "
            "series tell apart from the stable release's.",
            ["model", "version", "revision"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.payloads = Counter(
            "serving_payload_events_total",
            "Payload-log events (sampled requests and answers, SERVING_PAYLOAD_LOG_URL), by "
            "outcome: sent (the sink took it), dropped (the worker's queue was full, or it "
            "left with events queued), failed (the sink refused it or could not be reached).",
            ["outcome"],
            registry=r,
        )
        for reason in ("queue_full", "predicted_late", "deadline_passed"):
            self.rejections.labels(reason)
        for outcome in ("done", "failed"):
            self.jobs.labels(outcome)
        self._payload_outcomes = {
            outcome: self.payloads.labels(outcome) for outcome in ("sent", "dropped", "failed")
        }
        # Labelled children, kept: ``labels()`` takes a lock and checks its
        # arguments on every call, and these count every request.
        self._cache_results = {
            result: self.cache_requests.labels(result) for result in ("hit", "miss", "coalesced")
        }
        self._by_route: dict[tuple[str, int, str], tuple[Any, Any]] = {}
        # The model thread's histograms, written at most FLUSH_S after they were
        # observed (busy or idle: the batcher asks ``flush_in``), and before this
        # process answers /metrics.
        self._tallies = (Tally(self.batch_size), Tally(self.batch_duration), Tally(self.queue_wait))
        self._tally_lock = threading.Lock()
        # A generating handler's (the decoder's observer).
        self.generation = GenerationMetrics(r)
        self._flush_at = 0.0
        self._pending = False

    # -- batcher Observer -----------------------------------------------------

    def batch(self, size: int, duration_s: float, queue_waits_s: Sequence[float]) -> None:
        sizes, durations, waits = self._tallies
        with self._tally_lock:
            sizes.observe(size)
            durations.observe(duration_s)
            for wait in queue_waits_s:
                waits.observe(wait)
            self._pending = True
        if time.monotonic() >= self._flush_at:
            self.flush()

    def flush(self) -> None:
        """Write what ``batch`` has added up."""
        with self._tally_lock:
            for tally in self._tallies:
                tally.flush()
            self._pending = False
            self._flush_at = time.monotonic() + FLUSH_S

    def flush_in(self) -> float | None:
        return self._flush_at - time.monotonic() if self._pending else None

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def model_info(self, handler: Handler, build: str) -> None:
        """``serving_model_info`` for ``handler``, ``build`` its SERVING_MODEL_REVISION."""
        self.model.labels(
            handler_name(handler), handler.version, model_revision(handler, build)
        ).set(1)

    def failed(self, size: int) -> None:
        self.model_errors.inc(size)

    def depth(self, depth: int) -> None:
        self.queue_depth.set(depth)

    # -- cache CacheObserver -----------------------------------------------------

    def cache_request(self, result: str) -> None:
        counter = self._cache_results.get(result)
        (counter or self.cache_requests.labels(result)).inc()

    def cache_error(self, store: str) -> None:
        self.cache_errors.labels(store).inc()

    # -- HTTP -------------------------------------------------------------------

    def request(
        self, route: str, status: int, duration_s: float, protocol: str = "predict"
    ) -> None:
        # Few keys: the app's routes (unmatched paths share one) times the statuses.
        key = (route, status, protocol)
        children = self._by_route.get(key)
        if children is None:
            children = (
                self.requests.labels(route, str(status), protocol),
                self.latency.labels(route, protocol),
            )
            self._by_route[key] = children
        counter, latency = children
        counter.inc()
        latency.observe(duration_s)

    # -- the job consumer -------------------------------------------------------

    def jobs_finished(self, done: int, failed: int) -> None:
        self.jobs.labels("done").inc(done)
        self.jobs.labels("failed").inc(failed)

    def keys_file(self, errors: int) -> None:
        self.api_keys_file_errors.set(errors)

    def jobs_taken(self, waits_s: Sequence[float]) -> None:
        for wait in waits_s:
            self.job_wait.observe(wait)

    # -- payload logging's PayloadObserver -------------------------------------

    def payload_events(self, outcome: str, count: int) -> None:
        self._payload_outcomes[outcome].inc(count)

    def exposition(self) -> bytes:
        self.flush()  # this process's own; the others flush when idle, or within FLUSH_S
        self.generation.flush()
        if not directory.enabled():
            from prometheus_client import generate_latest

            return bytes(generate_latest(self.registry))
        return directory.exposition()
