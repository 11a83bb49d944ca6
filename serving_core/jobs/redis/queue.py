"""The shared job queue: Redis Streams with one consumer group, for many machines.

Keys, all under ``serving-core:jobs:{QUEUE}:`` (one hash tag, so a Redis
Cluster keeps a queue's keys in one slot and its scripts may touch them all):

- ``stream``: one entry per queued or running job, ``{job: ID}``; the group
  ``workers`` delivers it. An entry is acked *and deleted* when its job
  finishes, so the stream never needs MAXLEN trimming (which could drop jobs
  nobody ran) and ``XLEN`` is exactly the depth.
- ``job:ID``: a hash with the job's record; no expiry until it finishes, then
  ``jobs_ttl_s``.
- ``job:ID``'s fields: ``id``, ``status``, ``params`` (deleted when the job
  finishes), ``attempts``, ``created_at``, ``started_at``, ``finished_at``,
  ``result``, ``error``, ``entry`` (its stream entry), ``lease``, ``owner``
  (the submitting caller's identity, empty without API keys), ``digest``
  (the parameters' SHA-256, which an idempotency key is bound to) and
  ``traceparent`` (the submitter's span, empty untraced; absent from a job
  queued before it was kept, which reads as empty).
- ``key:OWNER:KEY``: an idempotency key's job id, for ``jobs_ttl_s``; each
  caller's keys are its own.
- ``dead``: failed job ids scored by when they failed.
- ``finished``: finished job ids scored by when they expire; with ``XLEN``, what
  ``jobs_max_stored`` counts (trimmed by each submit), and, counted from an
  expiry, how many finished lately: the drain rate a full queue's
  ``Retry-After`` comes from (``jobs.drainrate``).
- ``owners``: each owner's count of unfinished jobs, for ``jobs_max_per_caller``.
- ``consumers``: each consumer's latest heartbeat, scored by its time; the key
  expires ``jobs_ttl_s`` after the last one.

``take`` first reclaims entries whose lease ran out (``XAUTOCLAIM`` with
min-idle = ``jobs_lease_s``: a consumer died holding them), then reads new
ones with ``XREADGROUP COUNT n BLOCK ms``, so an idle worker waits in Redis,
not in a poll loop. The job's hash, not the stream, decides what a delivery
means: Lua scripts mark delivered jobs running, skip cancelled ones, and
count attempts in the hash (a release gives one back, which a stream's
delivery counter cannot). ``fail`` and ``release`` put a job back as a new
entry at the tail, which also wakes a consumer blocked in ``XREADGROUP``.
Every state change is one script, so it is atomic against the others.

Use a Redis with ``maxmemory-policy noeviction`` (or a database the cache
does not share): an evicted job hash is a lost job. ``connection`` has
the client (timeouts, gevent) and ``consumers`` the heartbeats.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from serving_core import encoding
from serving_core.jobs import drainrate
from serving_core.jobs.base import (
    MAX_STORED,
    Consumers,
    Job,
    KeyReused,
    QueueFull,
    QuotaExceeded,
    lease_expired_error,
    new_job_id,
    params_digest,
    quota_message,
)
from serving_core.jobs.redis.connection import GROUP, Arg, RedisConnection
from serving_core.jobs.redis.consumers import RedisConsumers
from serving_core.jobs.redis.hash import flat, job_of
from serving_core.jobs.redis.scripts import (
    CANCEL,
    COMPLETE,
    FAIL,
    MARK,
    RECLAIM,
    RELEASE,
    RENEW,
    SUBMIT,
)
from serving_core.settings import Settings

if TYPE_CHECKING:
    from redis.commands.core import Script

MAX_BLOCK_S = 5.0  # a take's blocking read, kept inside the socket timeout


class RedisJobQueue:
    """``JobQueue`` on the Redis at ``settings.jobs_url``; see ``serving_core.jobs.base``."""

    def __init__(self, settings: Settings, queue: str) -> None:
        self.queue = queue
        self.max_queue = settings.jobs_max_queue
        self.max_stored = settings.jobs_max_stored
        self.max_per_caller = settings.jobs_max_per_caller
        self.ttl_s = settings.jobs_ttl_s
        self.ttl_ms = max(1, round(settings.jobs_ttl_s * 1000))
        self.lease_ms = max(1, round(settings.jobs_lease_s * 1000))
        self.max_attempts = settings.jobs_max_attempts
        self.prefix = f"serving-core:jobs:{{{queue}}}:"
        self.stream = self.prefix + "stream"
        self.dead = self.prefix + "dead"
        self.finished = self.prefix + "finished"
        self.owners = self.prefix + "owners"
        self.redis = RedisConnection(settings.jobs_url, self.stream)
        self._consumers = RedisConsumers(
            self.redis,
            self.prefix + "consumers",
            lease_s=settings.jobs_lease_s,
            ttl_s=settings.jobs_ttl_s,
        )
        script = self.redis.script
        self._submit, self._reclaim, self._mark = script(SUBMIT), script(RECLAIM), script(MARK)
        self._complete, self._fail = script(COMPLETE), script(FAIL)
        self._release, self._cancel = script(RELEASE), script(CANCEL)
        self._renew = script(RENEW)

    def submit(
        self,
        params: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        owner: str = "",
        traceparent: str | None = None,
    ) -> Job:
        now = time.time()
        job_id = new_job_id()
        digest = params_digest(params)
        keys = [self.stream, self._job_key(job_id), f"{self.prefix}key:{owner}:{idempotency_key}"]
        keys += [self.finished, self.owners]
        argv: list[Arg] = [job_id, encoding.dumps(params), repr(now), self.ttl_ms, self.max_queue]
        argv += ["0" if idempotency_key is None else "1", self.prefix, digest, owner]
        argv += [
            self.max_stored,
            self.max_per_caller,
            repr(drainrate.expired_after(now, self.ttl_s)),
            traceparent or "",
        ]
        kind, value, *more = self.redis.run(self._submit, keys, argv)
        if kind == "existing":
            job = job_of(value, self.queue)
            if job.digest and job.digest != digest:
                raise KeyReused(job)
            return job
        if kind == "full":
            raise QueueFull(
                f"the {self.queue!r} job queue holds {value} unfinished jobs "
                f"(SERVING_JOBS_MAX_QUEUE={self.max_queue}); retry later",
                retry_after_s=drainrate.queue_full_retry_after(
                    int(value) - self.max_queue + 1, int(more[0]), self.ttl_s
                ),
            )
        if kind == "stored":
            raise QueueFull(
                f"the {self.queue!r} job queue holds {value} jobs "
                f"({MAX_STORED}={self.max_stored}); retry later",
                retry_after_s=drainrate.store_full_retry_after(
                    float(more[0]) if more[0] else None, now
                ),
                setting=MAX_STORED,
            )
        if kind == "quota":
            raise QuotaExceeded(quota_message(int(value), self.max_per_caller))
        return Job.queued(
            job_id,
            self.queue,
            params,
            now,
            owner=owner,
            digest=digest,
            traceparent=traceparent or "",
        )

    def get(self, job_id: str) -> Job | None:
        fields: Any = self.redis.call(lambda: self.redis.client.hgetall(self._job_key(job_id)))
        return job_of(flat(fields), self.queue) if fields else None

    def cancel(self, job_id: str) -> Job | None:
        keys = [self.stream, self._job_key(job_id), self.finished, self.owners]
        pairs = self.redis.run(self._cancel, keys, [GROUP, repr(time.time()), self.ttl_ms])
        return job_of(pairs, self.queue) if pairs else None

    def take(self, consumer: str, max_items: int, wait_s: float) -> list[Job]:
        self._consumers.beat(consumer)
        deadline = time.monotonic() + wait_s
        lease = f"{consumer}:{new_job_id()}"
        jobs = self._take_scripted(self._reclaim, lease, [consumer, self.lease_ms, max_items])
        while len(jobs) < max_items:
            remaining = deadline - time.monotonic()
            # BLOCK 0 would wait forever, so a spent wait reads without BLOCK; with
            # jobs in hand, only top the batch up with what is there now. A longer
            # wait returns empty after MAX_BLOCK_S, which "up to wait_s" allows.
            block_s = min(remaining, MAX_BLOCK_S)
            block = None if jobs or remaining <= 0 else max(1, round(block_s * 1000))
            reply = self._read_new(consumer, max_items - len(jobs), block)
            entries: list[Arg] = [
                item for entry_id, fields in reply for item in (entry_id, fields["job"])
            ]
            if not entries:
                break
            jobs += self._take_scripted(self._mark, lease, entries)
        return jobs

    def _read_new(
        self, consumer: str, count: int, block_ms: int | None
    ) -> list[tuple[str, dict[str, str]]]:
        reply: Any = self.redis.call(
            lambda: self.redis.client.xreadgroup(
                GROUP, consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        )
        # RESP2: [[stream, [(entry id, {field: value}), ...]]], or None after BLOCK.
        return list(reply[0][1]) if reply else []

    def _take_scripted(self, script: Script, lease: str, extra: list[Arg]) -> list[Job]:
        argv: list[Arg] = [GROUP, self.prefix, repr(time.time()), self.max_attempts]
        argv += [self.ttl_ms, lease, encoding.dumps(lease_expired_error(self.max_attempts))]
        rows, missing = self.redis.run(script, [self.stream, self.dead], argv + extra)
        self.redis.records_missing(missing)
        return [job_of(row, self.queue) for row in rows]

    def complete(self, job: Job, result: Any) -> None:
        self.complete_many([(job, result)])

    def complete_many(self, finished: Sequence[tuple[Job, Any]]) -> None:
        if not finished:
            return
        now = repr(time.time())

        def store() -> None:
            # One round trip: a pipeline of the script's EVALSHAs (not a
            # transaction; each script is atomic on its own, as in complete).
            pipe = self.redis.client.pipeline(transaction=False)
            for job, result in finished:
                argv: list[Arg] = [GROUP, encoding.dumps(result), now, self.ttl_ms]
                keys = [self.stream, self._job_key(job.id), self.finished, self.owners]
                self._complete(keys=keys, args=argv, client=pipe)
            pipe.execute()

        self.redis.call(store)

    def fail(self, job: Job, error: dict[str, Any], *, retry: bool = True) -> None:
        now = time.time()
        keys = [self.stream, self._job_key(job.id), self.dead, self.finished, self.owners]
        argv: list[Arg] = [GROUP, job.lease, encoding.dumps(error), repr(now), self.ttl_ms]
        argv += [self.max_attempts, job.id, "1" if retry else "0", repr(now - self.ttl_s)]
        self.redis.run(self._fail, keys, argv)

    def release(self, jobs: Sequence[Job]) -> None:
        if not jobs:
            return
        argv: list[Arg] = [GROUP, self.prefix]
        for job in jobs:
            argv += [job.id, job.lease]
        self.redis.run(self._release, [self.stream], argv)

    def renew(self, consumer: str, jobs: Sequence[Job]) -> int:
        if not jobs:
            return 0
        self._consumers.beat(consumer)
        argv: list[Arg] = [GROUP, self.prefix, consumer]
        for job in jobs:
            argv += [job.id, job.lease]
        return int(self.redis.run(self._renew, [self.stream], argv))

    def dead_letters(self, limit: int = 100) -> list[Job]:
        def read() -> list[Any]:
            self.redis.client.zremrangebyscore(self.dead, "-inf", time.time() - self.ttl_s)
            ids: Any = self.redis.client.zrevrange(self.dead, 0, limit - 1)
            pipe = self.redis.client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(self._job_key(job_id))
            return pipe.execute()

        # A dead letter's hash may expire before its id leaves the set: skip it.
        return [job_of(flat(fields), self.queue) for fields in self.redis.call(read) if fields]

    def depth(self) -> int:
        return int(self.redis.call(lambda: self.redis.client.xlen(self.stream)))

    def consumers(self, within_s: float) -> Consumers:
        return self._consumers.read(within_s)

    def close(self) -> None:
        self.redis.close()

    def _job_key(self, job_id: str) -> str:
        return self.prefix + "job:" + job_id
