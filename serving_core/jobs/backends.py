"""The job queue's backends, one table: ``BACKENDS`` maps ``SERVING_JOBS_URL``'s scheme
to the module of its backend.

A backend's module has what ``Backend`` names: the check of its URL, the check of
its store that every command opening the queue runs before the model loads
(``commands/startup.py``), and ``open_queue``. Each is imported only when its
scheme is used, so a SQLite deployment never imports the redis library. A new
backend is a subpackage with its ``backend`` module, and a line here.

This module sits above the backends, which import the types in ``jobs.base`` and
never this module.
"""

from __future__ import annotations

import importlib
from typing import Protocol, cast
from urllib.parse import urlsplit

from serving_core.jobs.base import JobQueue
from serving_core.settings import Settings
from serving_core.settings.secrets import masked

_SQLITE = "serving_core.jobs.sqlite.backend"
_REDIS = "serving_core.jobs.redis.backend"

BACKENDS: dict[str, str] = {
    "": _SQLITE,  # no URL: the SQLite file at SERVING_JOBS_PATH
    "sqlite": _SQLITE,
    "redis": _REDIS,
    "rediss": _REDIS,  # Redis over TLS
    "unix": _REDIS,  # Redis on a Unix socket
}


class Backend(Protocol):
    """What a backend's module provides (a module, not a class: its functions)."""

    # The setting a server and its workers must share to meet on one queue, which the
    # hint for an unconsumed queue names: SERVING_JOBS_PATH or SERVING_JOBS_URL.
    SHARED: str

    def check_url(self, url: str) -> None:
        """Raise ``ValueError`` naming SERVING_JOBS_URL, the URL masked, and the fix."""
        ...

    def check_store(self, settings: Settings) -> None:
        """At start-up: raise ``StoreRefused`` for a store that would lose jobs it accepted."""
        ...

    def open_queue(self, settings: Settings, queue: str, *, consumer: bool) -> JobQueue:
        """The queue of ``queue``'s jobs; ``consumer``: for a worker's consumer."""
        ...


def backend_for(url: str) -> Backend:
    """The backend of ``url``'s scheme; ``ValueError`` listing the schemes for another."""
    scheme = urlsplit(url).scheme.lower() if url else ""
    if scheme not in BACKENDS or (url and "://" not in url):
        known = ", ".join(f"{name}://" for name in BACKENDS if name)
        raise ValueError(
            f"SERVING_JOBS_URL={masked(url)!r} names no job queue backend; use a URL of "
            f"one of {known}, or leave it empty for the SQLite file at SERVING_JOBS_PATH"
        )
    return cast(Backend, importlib.import_module(BACKENDS[scheme]))


def check(settings: Settings) -> None:
    """What every command that opens the queue runs first, before the model loads:
    the URL's check (``ValueError``), then the store's (``StoreRefused``)."""
    backend = backend_for(settings.jobs_url)
    backend.check_url(settings.jobs_url)
    backend.check_store(settings)


def open_queue(settings: Settings, queue: str, *, consumer: bool = False) -> JobQueue:
    """The queue of ``queue``'s jobs on the backend ``settings.jobs_url`` names;
    ``consumer``: for a worker's consumer, which takes and finishes jobs only."""
    if not queue or not all(c.isalnum() or c in "-_." for c in queue):
        raise ValueError(f"queue name {queue!r}: use letters, digits, '-', '_' or '.'")
    backend = backend_for(settings.jobs_url)
    backend.check_url(settings.jobs_url)
    return backend.open_queue(settings, queue, consumer=consumer)
