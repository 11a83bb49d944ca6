"""The Redis Streams backend: a ``redis://``, ``rediss://`` (TLS) or ``unix://``
SERVING_JOBS_URL, checked as redis-py would take it when it first connects."""

from __future__ import annotations

from serving_core.jobs.base import JobQueue
from serving_core.jobs.redis.durability import check_redis, count_losses
from serving_core.jobs.redis.queue import RedisJobQueue
from serving_core.settings import Settings
from serving_core.settings.redisurl import EXAMPLES, redis_fault
from serving_core.settings.secrets import masked

SHARED = "SERVING_JOBS_URL"


def check_url(url: str) -> None:
    fault = redis_fault(url)
    if fault:
        raise ValueError(
            f"SERVING_JOBS_URL={masked(url)!r} {fault} for the job queue (Redis Streams); "
            f"use {EXAMPLES}, or leave it empty for the SQLite file at SERVING_JOBS_PATH"
        )


def check_store(settings: Settings) -> None:
    check_redis(settings.jobs_url)  # an evicting Redis is refused (StoreRefused)
    count_losses()  # 0 from the start, not "no data" until the first loss


def open_queue(settings: Settings, queue: str, *, consumer: bool) -> JobQueue:
    # ``consumer`` changes nothing here: it spares SQLite's consumers an fsync per
    # commit, where Redis's durability is the server's own configuration.
    return RedisJobQueue(settings, queue)
