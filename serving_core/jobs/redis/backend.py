"""The Redis Streams backend: a ``redis://``, ``rediss://`` (TLS) or ``unix://``
SERVING_JOBS_URL, checked as redis-py would take it when it first connects."""

from __future__ import annotations

from urllib.parse import urlsplit

from serving_core.jobs.base import JobQueue
from serving_core.jobs.redis.durability import check_redis, count_losses
from serving_core.jobs.redis.queue import RedisJobQueue
from serving_core.settings import Settings
from serving_core.settings.addresses import masked

SHARED = "SERVING_JOBS_URL"
EXAMPLES = "redis://HOST:6379/0, rediss://… (TLS) or unix:///path/redis.sock"


def check_url(url: str) -> None:
    fault = _fault(url)
    if fault:
        raise ValueError(
            f"SERVING_JOBS_URL={masked(url)!r} {fault} for the job queue (Redis Streams); "
            f"use {EXAMPLES}, or leave it empty for the SQLite file at SERVING_JOBS_PATH"
        )


def _fault(url: str) -> str | None:
    """Why redis-py would refuse ``url`` when it first connects, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix") or not url.startswith(parts.scheme + "://"):
        return "is not a Redis URL"
    if parts.scheme == "unix" and not parts.path:
        return "names no socket path"
    try:
        parts.port  # noqa: B018 (a port that is not a number, or past 65535, raises)
    except ValueError:
        return "has a port that is not 0..65535"
    return None


def check_store(settings: Settings) -> None:
    check_redis(settings.jobs_url)  # an evicting Redis is refused (StoreRefused)
    count_losses()  # 0 from the start, not "no data" until the first loss


def open_queue(settings: Settings, queue: str, *, consumer: bool) -> JobQueue:
    # ``consumer`` changes nothing here: it spares SQLite's consumers an fsync per
    # commit, where Redis's durability is the server's own configuration.
    return RedisJobQueue(settings, queue)
