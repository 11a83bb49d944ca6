"""Prometheus metrics, correct across gunicorn workers.

prometheus-client's multiprocess mode keeps each worker's values in memory-
mapped files under one directory, and ``/metrics`` sums them. It chooses its
storage when ``prometheus_client`` is first imported, from
``PROMETHEUS_MULTIPROC_DIR``; so ``enable_multiprocess`` sets that variable
before anything imports it, and this module imports it lazily. Without it
(the Flask test client, ``serving-core check``) the metrics live in-process.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving_core.settings import SettingsError

log = logging.getLogger("serving_core.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
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

# The directory ``enable_multiprocess`` chose (None: in-process metrics), kept
# here for this process and the workers it forks; the environment variable is
# only prometheus-client's way of being told.
_directory: str | None = None


def enable_multiprocess(directory: str) -> str:
    """Point prometheus-client at a fresh directory; call before it is imported.

    An empty ``directory`` means a new temporary one. Files left by an earlier
    run are removed: they would be summed into this run's counters.
    """
    global _directory  # noqa: PLW0603 - one metrics directory per process tree
    imported = "prometheus_client" in sys.modules
    # prometheus-client's own variable, not a setting: whether its import chose
    # multiprocess mode already.
    if imported and MULTIPROC_ENV not in os.environ:
        raise SettingsError(
            "prometheus_client was imported before SERVING_METRICS_DIR was applied; "
            "import it lazily in your handler (inside setup())"
        )
    try:
        path = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="serving-metrics-"))
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
    except OSError as exc:
        raise SettingsError(
            f"SERVING_METRICS_DIR={directory!r} cannot be used ({exc}); "
            "point it at a writable directory (an emptyDir in Kubernetes)"
        ) from exc
    os.environ[MULTIPROC_ENV] = _directory = str(path)
    if not imported:
        _cache_pid()
    return str(path)


# prometheus-client's multiprocess values call os.getpid() on every write, to
# notice a fork: a system call per counter or bucket, about ten a request. This
# process's pid is kept here instead, refreshed in every forked child.
_pid = os.getpid()


def _refresh_pid() -> None:
    global _pid  # noqa: PLW0603 - one pid per process
    _pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


def _cache_pid() -> None:
    """Make prometheus-client's multiprocess values read the pid kept here. Only before
    any metric exists: values made by two value classes would write one file as two."""
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue(  # type: ignore[no-untyped-call]
        process_identifier=lambda: _pid
    )


def remove_metrics_dir() -> None:
    path = _directory
    if path and Path(path).name.startswith("serving-metrics-"):
        shutil.rmtree(path, ignore_errors=True)


def worker_exited(pid: int) -> None:
    """gunicorn ``child_exit``: drop a dead worker's live gauges and fold its counters
    and histograms into the directory's archive (its counts stay counted)."""
    path = _directory
    if path:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
        archive_dead_worker(Path(path), pid)


# The files a dead worker leaves whose values add up across processes. (Gauges:
# ours are all live*, removed above.)
SUMMED_KINDS = ("counter", "histogram", "summary")


def archive_dead_worker(directory: Path, pid: int) -> None:
    """Add a dead worker's counters and histograms into ``KIND_archive.db`` and remove
    its files: a worker recycled every N requests would otherwise leave two files
    per generation, which every scrape reads, without end.

    The new archive is written aside and renamed into place, then the dead file is
    removed: a scrape between the two (two system calls) counts it twice.
    """
    from prometheus_client.mmap_dict import MmapedDict

    for kind in SUMMED_KINDS:
        dead = directory / f"{kind}_{pid}.db"
        if not dead.exists():
            continue
        archive = directory / f"{kind}_archive.db"
        fresh = directory / f"{kind}_archive.db.new"  # not *.db: no scrape reads it
        try:
            totals: dict[str, float] = {}
            for source in (archive, dead):
                if source.exists():
                    read = MmapedDict.read_all_values_from_file
                    for key, value, _ts, _pos in read(str(source)):  # type: ignore[no-untyped-call]
                        totals[key] = totals.get(key, 0.0) + value
            fresh.unlink(missing_ok=True)
            merged = MmapedDict(str(fresh))  # type: ignore[no-untyped-call]
            try:
                for key, value in totals.items():
                    merged.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
            finally:
                merged.close()  # type: ignore[no-untyped-call]
            os.replace(fresh, archive)
            dead.unlink()
        except OSError as exc:
            log.warning(
                "could not fold worker %d's %s metrics into %s: %s", pid, kind, archive, exc
            )


class Tally:
    """A histogram's observations, added up in memory and written by ``flush``.

    In multiprocess mode each ``observe`` writes twice to a memory-mapped file,
    under a lock, and prometheus-client has no call that observes many values
    at once. The model thread observed three histograms per batch, six writes
    (``Metrics.batch``: 5.7 us a call; 0.87 with tallies, both measured in
    multiprocess mode), per request for an unbatched handler. A tally counts in
    plain Python instead and, on flush, adds each
    bucket's count and the sum through the histogram's own values. ``_sum``,
    ``_buckets`` and ``_upper_bounds`` are prometheus-client's internals
    (pinned in requirements.txt); tests/test_metrics.py checks that a flushed
    tally writes what ``observe`` would have. Not thread-safe: its owner locks.
    """

    def __init__(self, histogram: Any) -> None:
        self._histogram = histogram
        self._bounds: list[float] = list(histogram._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = False

    def observe(self, amount: float) -> None:
        self._sum += amount
        # The first bound >= amount, as ``Histogram.observe`` picks it (the last is +Inf).
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._pending = True

    def flush(self) -> None:
        if not self._pending:
            return
        histogram, counts = self._histogram, self._counts
        histogram._sum.inc(self._sum)
        for index, count in enumerate(counts):
            if count:
                histogram._buckets[index].inc(count)
                counts[index] = 0
        self._sum = 0.0
        self._pending = False


class Metrics:
    """The service's metrics; implements the batcher's ``Observer``."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        # A registry per instance: tests build many apps in one process.
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "serving_requests_total",
            "HTTP requests answered, by route and status code.",
            ["route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "serving_request_duration_seconds",
            "Time from a request's arrival to its response, by route.",
            ["route"],
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
        for reason in ("queue_full", "predicted_late", "deadline_passed"):
            self.rejections.labels(reason)
        for outcome in ("done", "failed"):
            self.jobs.labels(outcome)
        # Labelled children, kept: ``labels()`` takes a lock and checks its
        # arguments on every call, and these count every request.
        self._cache_results = {
            result: self.cache_requests.labels(result) for result in ("hit", "miss", "coalesced")
        }
        self._by_route: dict[tuple[str, int], tuple[Any, Any]] = {}
        # The model thread's histograms, written at most FLUSH_S after they were
        # observed (busy or idle: the batcher asks ``flush_in``), and before this
        # process answers /metrics.
        self._tallies = (Tally(self.batch_size), Tally(self.batch_duration), Tally(self.queue_wait))
        self._tally_lock = threading.Lock()
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

    def request(self, route: str, status: int, duration_s: float) -> None:
        # Few keys: the app's routes (unmatched paths share one) times the statuses.
        children = self._by_route.get((route, status))
        if children is None:
            children = self.requests.labels(route, str(status)), self.latency.labels(route)
            self._by_route[(route, status)] = children
        counter, latency = children
        counter.inc()
        latency.observe(duration_s)

    # -- the job consumer -------------------------------------------------------

    def jobs_finished(self, done: int, failed: int) -> None:
        self.jobs.labels("done").inc(done)
        self.jobs.labels("failed").inc(failed)

    def jobs_taken(self, waits_s: Sequence[float]) -> None:
        for wait in waits_s:
            self.job_wait.observe(wait)

    def exposition(self) -> bytes:
        self.flush()  # this process's own; the others flush when idle, or within FLUSH_S
        if _directory is None:
            from prometheus_client import generate_latest

            return bytes(generate_latest(self.registry))
        return exposition()


def exposition() -> bytes:
    """Every process's metrics, summed: what /metrics answers in multiprocess mode."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    try:
        return bytes(generate_latest(registry))
    except FileNotFoundError:
        # A dead worker's file was folded into the archive between the collector's
        # listing and its reading: the next listing has the archive instead.
        return bytes(generate_latest(registry))
