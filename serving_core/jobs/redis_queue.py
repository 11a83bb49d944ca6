"""The shared job queue: Redis Streams with one consumer group, for many machines.

Keys, all under ``serving-core:jobs:{QUEUE}:`` (one hash tag, so a Redis
Cluster keeps a queue's keys in one slot and its scripts may touch them all):

- ``stream``: one entry per queued or running job, ``{job: ID}``; the group
  ``workers`` delivers it. An entry is acked *and deleted* when its job
  finishes, so the stream never needs MAXLEN trimming (which could drop jobs
  nobody ran) and ``XLEN`` is exactly the depth.
- ``job:ID``: a hash with the job's record; no expiry until it finishes, then
  ``jobs_ttl_s``.
- ``key:KEY``: an idempotency key's job id, for ``jobs_ttl_s``.
- ``dead``: failed job ids scored by when they failed.
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
does not share): an evicted job hash is a lost job.

gevent: redis-py's plain ``ConnectionPool`` (redis 8.1's ``connection.py``)
holds its native lock only to pop or push a connection, never across I/O, and
sockets are patched, so request greenlets calling ``submit``/``get``/``cancel``
yield while Redis answers. Every command is bounded by ``COMMAND_TIMEOUT_S``,
so a hung Redis fails a request instead of holding it forever.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from serving_core import encoding
from serving_core.jobs.base import (
    Consumers,
    Heartbeat,
    Job,
    JobStatus,
    QueueFull,
    QueueUnavailable,
    lease_expired_error,
    new_job_id,
)
from serving_core.jobs.redis_scripts import (
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
    import redis
    from redis.commands.core import Script

GROUP = "workers"
COMMAND_TIMEOUT_S = 10.0  # connect, and every command (socket timeout)
MAX_BLOCK_S = 5.0  # a take's blocking read, kept inside the socket timeout
T = TypeVar("T")
Arg = bytes | str | int | float  # what a script's ARGV takes


class RedisJobQueue:
    """``JobQueue`` on the Redis at ``settings.jobs_url``; see ``serving_core.jobs.base``."""

    def __init__(self, settings: Settings, queue: str) -> None:
        import redis

        self.queue = queue
        self.max_queue = settings.jobs_max_queue
        self.ttl_s = settings.jobs_ttl_s
        self.ttl_ms = max(1, round(settings.jobs_ttl_s * 1000))
        self.lease_ms = max(1, round(settings.jobs_lease_s * 1000))
        self.max_attempts = settings.jobs_max_attempts
        self.prefix = f"serving-core:jobs:{{{queue}}}:"
        self.stream = self.prefix + "stream"
        self.dead = self.prefix + "dead"
        self._consumers = self.prefix + "consumers"
        self._heartbeat = Heartbeat(settings.jobs_lease_s)
        self._errors = (redis.RedisError, OSError)
        self.client: redis.Redis = redis.Redis.from_url(
            settings.jobs_url,
            decode_responses=True,
            socket_timeout=COMMAND_TIMEOUT_S,
            socket_connect_timeout=COMMAND_TIMEOUT_S,
        )
        register = self.client.register_script
        self._submit, self._reclaim, self._mark = (
            register(SUBMIT),
            register(RECLAIM),
            register(MARK),
        )
        self._complete, self._fail = register(COMPLETE), register(FAIL)
        self._release, self._cancel = register(RELEASE), register(CANCEL)
        self._renew = register(RENEW)
        self._group_ready = False  # created on first use, so opening needs no Redis

    def submit(self, params: dict[str, Any], *, idempotency_key: str | None = None) -> Job:
        now = time.time()
        job_id = new_job_id()
        keys = [self.stream, self._job_key(job_id), self.prefix + "key:" + (idempotency_key or "")]
        argv: list[Arg] = [job_id, encoding.dumps(params), repr(now), self.ttl_ms, self.max_queue]
        argv += ["0" if idempotency_key is None else "1", self.prefix]
        kind, value = self._run(self._submit, keys, argv)
        if kind == "existing":
            return self._job(value)
        if kind == "full":
            raise QueueFull(
                f"the {self.queue!r} job queue holds {value} unfinished jobs "
                f"(SERVING_JOBS_MAX_QUEUE={self.max_queue}); retry later"
            )
        return Job(job_id, self.queue, "queued", params, 0, now, None, None, None, None)

    def get(self, job_id: str) -> Job | None:
        fields: Any = self._call(lambda: self.client.hgetall(self._job_key(job_id)))
        return self._job(_flat(fields)) if fields else None

    def cancel(self, job_id: str) -> Job | None:
        keys = [self.stream, self._job_key(job_id)]
        flat = self._run(self._cancel, keys, [GROUP, repr(time.time()), self.ttl_ms])
        return self._job(flat) if flat else None

    def take(self, consumer: str, max_items: int, wait_s: float) -> list[Job]:
        self._beat(consumer)
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
        reply: Any = self._call(
            lambda: self.client.xreadgroup(
                GROUP, consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        )
        # RESP2: [[stream, [(entry id, {field: value}), ...]]], or None after BLOCK.
        return list(reply[0][1]) if reply else []

    def _take_scripted(self, script: Script, lease: str, extra: list[Arg]) -> list[Job]:
        argv: list[Arg] = [GROUP, self.prefix, repr(time.time()), self.max_attempts]
        argv += [self.ttl_ms, lease, encoding.dumps(lease_expired_error(self.max_attempts))]
        rows = self._run(script, [self.stream, self.dead], argv + extra)
        return [self._job(row) for row in rows]

    def complete(self, job: Job, result: Any) -> None:
        self.complete_many([(job, result)])

    def complete_many(self, finished: Sequence[tuple[Job, Any]]) -> None:
        if not finished:
            return
        now = repr(time.time())

        def store() -> None:
            # One round trip: a pipeline of the script's EVALSHAs (not a
            # transaction; each script is atomic on its own, as in complete).
            pipe = self.client.pipeline(transaction=False)
            for job, result in finished:
                argv: list[Arg] = [GROUP, encoding.dumps(result), now, self.ttl_ms]
                self._complete(keys=[self.stream, self._job_key(job.id)], args=argv, client=pipe)
            pipe.execute()

        self._call(store)

    def fail(self, job: Job, error: dict[str, Any], *, retry: bool = True) -> None:
        now = time.time()
        keys = [self.stream, self._job_key(job.id), self.dead]
        argv: list[Arg] = [GROUP, job.lease, encoding.dumps(error), repr(now), self.ttl_ms]
        argv += [self.max_attempts, job.id, "1" if retry else "0", repr(now - self.ttl_s)]
        self._run(self._fail, keys, argv)

    def release(self, jobs: Sequence[Job]) -> None:
        if not jobs:
            return
        argv: list[Arg] = [GROUP, self.prefix]
        for job in jobs:
            argv += [job.id, job.lease]
        self._run(self._release, [self.stream], argv)

    def renew(self, consumer: str, jobs: Sequence[Job]) -> int:
        if not jobs:
            return 0
        self._beat(consumer)
        argv: list[Arg] = [GROUP, self.prefix, consumer]
        for job in jobs:
            argv += [job.id, job.lease]
        return int(self._run(self._renew, [self.stream], argv))

    def dead_letters(self, limit: int = 100) -> list[Job]:
        def read() -> list[Any]:
            self.client.zremrangebyscore(self.dead, "-inf", time.time() - self.ttl_s)
            ids: Any = self.client.zrevrange(self.dead, 0, limit - 1)
            pipe = self.client.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(self._job_key(job_id))
            return pipe.execute()

        # A dead letter's hash may expire before its id leaves the set: skip it.
        return [self._job(_flat(fields)) for fields in self._call(read) if fields]

    def depth(self) -> int:
        return int(self._call(lambda: self.client.xlen(self.stream)))

    def consumers(self, within_s: float) -> Consumers:
        def read() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            pipe.zcount(self._consumers, time.time() - within_s, "+inf")
            pipe.zrevrange(self._consumers, 0, 0, withscores=True)
            return pipe.execute()

        live, latest = self._call(read)
        return Consumers(int(live), float(latest[0][1]) if latest else None)

    def _beat(self, consumer: str) -> None:
        now = time.time()
        if not self._heartbeat.due(consumer, now):
            return

        def record() -> None:
            pipe = self.client.pipeline(transaction=False)
            pipe.zadd(self._consumers, {consumer: now})
            # Consumer names are host-pid: each restart adds one, so forget old ones.
            pipe.zremrangebyscore(self._consumers, "-inf", now - self.ttl_s)
            pipe.pexpire(self._consumers, self.ttl_ms)
            pipe.execute()

        self._call(record)

    def close(self) -> None:
        self.client.close()

    def _run(self, script: Script, keys: list[str], argv: list[Arg]) -> Any:
        return self._call(lambda: script(keys=keys, args=argv))

    def _job_key(self, job_id: str) -> str:
        return self.prefix + "job:" + job_id

    def _call(self, command: Callable[[], T]) -> T:
        import redis

        with self._translated():
            if not self._group_ready:
                self._create_group()
            try:
                return command()
            except redis.ResponseError as error:
                # The stream was deleted under us (FLUSHDB, a restarted Redis
                # without persistence): recreate the group and try once more.
                if "NOGROUP" not in str(error):
                    raise
                self._create_group()
                return command()

    def _create_group(self) -> None:
        import redis

        try:
            # From id 0: jobs submitted before any consumer existed are delivered too.
            self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
        self._group_ready = True

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except self._errors as error:
            raise QueueUnavailable(f"the job queue's Redis failed: {error}") from error

    def _job(self, flat: list[str]) -> Job:
        fields = dict(zip(flat[::2], flat[1::2], strict=True))

        def optional_float(name: str) -> float | None:
            value = fields.get(name, "")
            return float(value) if value else None

        def optional_json(name: str) -> Any:
            value = fields.get(name, "")
            return encoding.loads(value) if value else None

        return Job(
            id=fields["id"],
            queue=self.queue,
            status=cast(JobStatus, fields["status"]),
            params=encoding.loads(fields["params"]),
            attempts=int(fields["attempts"]),
            created_at=float(fields["created_at"]),
            started_at=optional_float("started_at"),
            finished_at=optional_float("finished_at"),
            result=optional_json("result"),
            error=optional_json("error"),
            lease=fields.get("lease", ""),
        )


def _flat(fields: dict[str, str]) -> list[str]:
    return [item for pair in fields.items() for item in pair]
