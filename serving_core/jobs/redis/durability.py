"""Whether the job queue's Redis keeps what it accepts: checked at start, and losses counted.

A queue on Redis is only as durable as that Redis is configured to be, and
nothing in the protocol says how it is: an evicting ``maxmemory-policy``
deletes job records under memory pressure, and with AOF off a restart loses
every job since the last snapshot. So every command that uses the queue
(``serve``, ``worker``) calls ``check_redis`` before it starts (through
``backend.check_store``): an evicting policy stops it, a Redis that may lose
jobs on a restart or a power cut is a warning. Managed Redis services often
rename or forbid ``CONFIG``; then the same fields are read from ``INFO``, which
they allow (without ``appendfsync``).

What the check cannot prevent is still seen when it happens:
``job_record_missing`` (a stream entry whose job hash is gone: evicted, or
deleted by hand) and ``group_recreated`` (the stream vanished: a flushed or
restarted Redis without persistence) each log a warning and count in
``serving_jobs_lost_total``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from serving_core.jobs.base import StoreRefused
from serving_core.settings.secrets import masked

if TYPE_CHECKING:
    import redis

log = logging.getLogger("serving_core.jobs.redis.durability")

CHECK_TIMEOUT_S = 5.0
SAFE_POLICY = "noeviction"
LOSSES = ("record_missing", "group_recreated")  # the counter's label values
FIX = "docs/guarantees.md says which Redis settings give which guarantee"


def check_redis(url: str) -> None:
    """Refuse an evicting Redis at ``url`` (``StoreRefused``); warn when it may lose jobs.

    A Redis that cannot be reached is a warning, not a refusal: a queue opens
    without one (a pod may start before its Redis), and each request then fails
    with 503 until it answers.
    """
    import redis

    shown = masked(url)

    client = redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=CHECK_TIMEOUT_S,
        socket_connect_timeout=CHECK_TIMEOUT_S,
    )
    try:
        config = _read(client, shown)
    except (redis.RedisError, OSError) as error:
        log.warning(
            "could not check the job queue's Redis %s (%s): its eviction policy and "
            "persistence are unchecked",
            shown,
            error,
        )
        return
    finally:
        client.close()
    if config is None:
        return
    policy = config.get("maxmemory-policy", "")
    if policy and policy != SAFE_POLICY:
        raise StoreRefused(
            f"the job queue's Redis {shown} has maxmemory-policy {policy}, which deletes "
            f"keys when memory is full: queued jobs would be lost. Set maxmemory-policy "
            f"{SAFE_POLICY} on it (redis.conf, or `redis-server --maxmemory-policy "
            f"{SAFE_POLICY}`), or give the queue a Redis of its own; {FIX}"
        )
    if config.get("appendonly") == "no":
        log.warning(
            "the job queue's Redis %s has AOF off (appendonly no): a restart loses every "
            "job accepted since its last snapshot; set appendonly yes and appendfsync "
            "always; %s",
            shown,
            FIX,
        )
    elif config.get("appendfsync", "always") != "always":
        log.warning(
            "the job queue's Redis %s has appendfsync %s: a power cut can lose the jobs "
            "accepted in the last second; set appendfsync always; %s",
            shown,
            config["appendfsync"],
            FIX,
        )


def _read(client: redis.Redis, shown: str) -> dict[str, str] | None:
    """The settings the check needs, from CONFIG GET, else INFO (None: neither answers)."""
    import redis

    try:
        config: dict[str, str] = {}
        for pattern in ("maxmemory-policy", "append*"):
            found: Any = client.config_get(pattern)
            config.update(found)
        return config
    except redis.ResponseError as error:  # renamed, disabled, or denied by an ACL
        log.warning(
            "the job queue's Redis %s refused CONFIG GET (%s); reading INFO instead, "
            "which does not show appendfsync",
            shown,
            error,
        )
    try:
        memory: Any = client.info("memory")
        persistence: Any = client.info("persistence")
    except redis.ResponseError as error:
        log.warning(
            "the job queue's Redis %s refused INFO too (%s): its eviction policy and "
            "persistence are unchecked",
            shown,
            error,
        )
        return None
    aof = persistence.get("aof_enabled")
    return {
        "maxmemory-policy": str(memory.get("maxmemory_policy", "")),
        "appendonly": "" if aof is None else ("yes" if int(aof) else "no"),
    }


def _lost() -> Any:
    """The counter, made on first use. A module global, unlike the service's metrics:
    losses are seen deep in a queue's connection, which is opened in every web worker
    and every consumer, and prometheus-client's multiprocess files sum a counter of any
    registry into ``/metrics`` (serve's and the worker's), so none is threaded through."""
    global _counter  # noqa: PLW0603 - one per process, as prometheus-client's own values
    if _counter is None:
        from prometheus_client import Counter

        _counter = Counter(
            "serving_jobs_lost",
            "Job queue losses seen on Redis, by kind (record_missing: a queued job's "
            "record was gone, evicted or deleted; group_recreated: the queue's stream "
            "vanished, as after a flushed or restarted Redis without persistence).",
            ["kind"],
            registry=None,
        )
        for kind in LOSSES:
            _counter.labels(kind)
    return _counter


_counter: Any = None


def count_losses() -> None:
    """Make the counter now (at start), so that it shows 0 rather than no data."""
    _lost()


def job_records_missing(stream: str, job_ids: Sequence[str]) -> None:
    log.warning(
        "the records of %d queued job(s) of %s were missing from Redis, so they cannot "
        "run: %s. An evicting maxmemory-policy or a key deleted by hand does this; %s",
        len(job_ids),
        stream,
        ", ".join(job_ids),
        FIX,
    )
    _lost().labels("record_missing").inc(len(job_ids))


def group_recreated(stream: str) -> None:
    log.warning(
        "the job queue's stream %s or its consumer group vanished from Redis and was "
        "created again: a flushed Redis, or one restarted without persistence, lost "
        "the jobs it held; %s",
        stream,
        FIX,
    )
    _lost().labels("group_recreated").inc()
