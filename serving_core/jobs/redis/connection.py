"""The Redis queue's connection: one client, the stream's consumer group, its errors.

Every command goes through ``call``, which creates the group on first use (so
opening needs no Redis), creates it again when Redis answers NOGROUP (and says
so: ``durability`` logs and counts it, since the jobs the stream held
are lost), and turns Redis and socket errors into ``QueueUnavailable``.

gevent: redis-py's plain ``ConnectionPool`` (redis 8.1's ``connection.py``)
holds its native lock only to pop or push a connection, never across I/O, and
sockets are patched, so request greenlets calling ``submit``/``get``/``cancel``
yield while Redis answers. Every command is bounded by ``COMMAND_TIMEOUT_S``,
so a hung Redis fails a request instead of holding it forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from serving_core.jobs.base import QueueUnavailable
from serving_core.jobs.redis.durability import group_recreated, job_records_missing

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

log = logging.getLogger("serving_core.jobs.redis.connection")

GROUP = "workers"
COMMAND_TIMEOUT_S = 10.0  # connect, and every command (socket timeout)
T = TypeVar("T")
Arg = bytes | str | int | float  # what a script's ARGV takes
STREAM_GONE = ("NOGROUP", "UNBLOCKED the stream key no longer exists")


class RedisConnection:
    """The Redis at ``url``, for the queue whose stream is ``stream``."""

    def __init__(self, url: str, stream: str) -> None:
        import redis

        self.stream = stream
        self._errors = (redis.RedisError, OSError)
        self.client: redis.Redis = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=COMMAND_TIMEOUT_S,
            socket_connect_timeout=COMMAND_TIMEOUT_S,
        )
        self._group_ready = False  # created on first use, so opening needs no Redis

    def script(self, source: str) -> Script:
        return self.client.register_script(source)

    def run(self, script: Script, keys: list[str], argv: list[Arg]) -> Any:
        return self.call(lambda: script(keys=keys, args=argv))

    def call(self, command: Callable[[], T]) -> T:
        import redis

        with self._translated():
            if not self._group_ready:
                self._create_group()
            try:
                return command()
            except redis.ResponseError as error:
                # The stream was deleted under us (FLUSHDB, a restarted Redis
                # without persistence): recreate the group and try once more.
                # A read blocked on the stream then is UNBLOCKED (Redis 7).
                if not any(sign in str(error) for sign in STREAM_GONE):
                    raise
                self._create_group()
                group_recreated(self.stream)
                return command()

    def records_missing(self, job_ids: list[str]) -> None:
        """The take scripts dropped these jobs' stream entries: their records were gone."""
        if job_ids:
            job_records_missing(self.stream, job_ids)

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
            # redis-py's message names the host and port: for the operator's log,
            # not for the client, which reads the exception's message (a 503's).
            log.warning("the job queue's Redis failed: %s", error)
            raise QueueUnavailable("the job queue's store did not answer") from error

    def close(self) -> None:
        self.client.close()
