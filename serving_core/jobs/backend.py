"""The choice of job queue backend: SQLite (the default) or Redis Streams, by ``SERVING_JOBS_URL``.

It sits above the backends, which import the types in ``jobs.base`` and never
this module.
"""

from __future__ import annotations

from serving_core.jobs.base import JobQueue
from serving_core.jobs.sqlite_queue import SqliteJobQueue
from serving_core.settings import Settings


def open_queue(settings: Settings, queue: str, *, consumer: bool = False) -> JobQueue:
    """The queue of ``queue``'s jobs on the backend ``settings.jobs_url`` names;
    ``consumer``: for a worker's consumer, which takes and finishes jobs only."""
    if not queue or not all(c.isalnum() or c in "-_." for c in queue):
        raise ValueError(f"queue name {queue!r}: use letters, digits, '-', '_' or '.'")
    if settings.jobs_url:
        # Imported here so that a SQLite deployment never imports the redis library
        # (this module sits above both backends: no cycle depends on it).
        from serving_core.jobs.redis_queue import RedisJobQueue

        return RedisJobQueue(settings, queue)
    return SqliteJobQueue(settings, queue, consumer=consumer)
