"""prometheus-client's multiprocess mode: one directory of files, summed by ``/metrics``.

prometheus-client keeps each worker's values in memory-mapped files under one
directory. It chooses its storage when ``prometheus_client`` is first
imported, from ``PROMETHEUS_MULTIPROC_DIR``; so ``enable_multiprocess`` sets
that variable before anything imports it, and the metrics modules import it
lazily. Without it (the Flask test client, ``serving-core check``) the
metrics live in-process.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from serving_core.metrics.archive import archive_dead_worker
from serving_core.settings import SettingsError

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The files prometheus-client writes (values.MultiProcessValue: TYPE[_MODE]_PID.db,
# the pid being ours, see _cache_pid) and the archive writes (archive.py), and no
# other: SERVING_METRICS_DIR=/tmp must not delete another program's *.db.
OWN_FILE = re.compile(
    r"(counter|histogram|summary|gauge_(live)?(all|min|max|sum|mostrecent))_(\d+|archive)\.db"
)

# The directory ``enable_multiprocess`` chose (None: in-process metrics), kept
# here for this process and the workers it forks; the environment variable is
# only prometheus-client's way of being told.
_directory: str | None = None


def enable_multiprocess(directory: str) -> str:
    """Point prometheus-client at a fresh directory; call before it is imported.

    An empty ``directory`` means a new temporary one. Metrics files left by an
    earlier run are removed (they would be summed into this run's counters), and
    only those (``OWN_FILE``): the directory may be shared, even ``/tmp``.
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
            if OWN_FILE.fullmatch(stale.name):
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


def enabled() -> bool:
    """Whether this process tree's metrics are summed across processes."""
    return _directory is not None


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
