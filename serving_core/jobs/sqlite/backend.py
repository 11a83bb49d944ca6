"""The SQLite backend: an empty SERVING_JOBS_URL (or ``sqlite://``), and the file at
SERVING_JOBS_PATH."""

from __future__ import annotations

from serving_core.jobs.base import JobQueue
from serving_core.jobs.sqlite.queue import SqliteJobQueue
from serving_core.settings import Settings
from serving_core.settings.secrets import masked

SHARED = "SERVING_JOBS_PATH"


def check_url(url: str) -> None:
    # One place names the file: a path in the URL would be a second.
    if url not in ("", "sqlite://"):
        raise ValueError(
            f"SERVING_JOBS_URL={masked(url)!r}: the SQLite queue's file is SERVING_JOBS_PATH, "
            "not a path in the URL; set SERVING_JOBS_PATH to the file and leave "
            "SERVING_JOBS_URL empty (or sqlite://)"
        )


def check_store(settings: Settings) -> None:
    """Nothing to check before the model loads: the file is made private when first
    opened (``file.create_private``), and one that cannot be opened is a ``503``
    whose reason the log names."""


def open_queue(settings: Settings, queue: str, *, consumer: bool) -> JobQueue:
    return SqliteJobQueue(settings, queue, consumer=consumer)
