"""The inference cache in Redis, shared by every worker and replica: the store of
``redis://``, ``rediss://`` (TLS) and ``unix://`` (``cache.stores``).

Redis and the gevent hub. gevent workers patch sockets but not ``threading``
(``process/workers/green.py``), so a native lock held by a greenlet across socket I/O would
freeze every request of the worker. redis-py's plain ``ConnectionPool`` (read
in redis 8.1's ``connection.py``) holds its native ``RLock`` only to pop or
push a connection object; ``connect()`` and every command's send and read run
outside it, on gevent's patched sockets, so a slow Redis yields to the other
greenlets. ``RedisStore`` therefore uses that pool, never
``BlockingConnectionPool`` (when empty it waits on ``queue.LifoQueue``, a
native condition variable, which would block the hub), nor a
``single_connection_client`` (a native lock around each command's I/O). It
also turns off redis-py's retries (three, with back-off, by default): a miss
costs at most ``timeout_s``, and after a failure the store answers
``StoreError`` at once for ``cooldown_s`` instead of queueing every request
behind a dead server's timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from serving_core.cache.store import StoreError, StoreUnavailable
from serving_core.settings.redisurl import EXAMPLES, redis_fault
from serving_core.settings.secrets import masked

if TYPE_CHECKING:
    import redis


def check(url: str) -> None:
    """What redis-py would refuse when it first connects: ``ValueError`` saying so."""
    fault = redis_fault(url)
    if fault:
        raise ValueError(f"{masked(url)!r} {fault}; use {EXAMPLES}")


def open_store(url: str, ttl_s: float) -> RedisStore:
    return RedisStore(url, ttl_s)


class RedisStore:
    """Entries in Redis (``SET … PX``, ``GET``), shared by every worker and replica.

    ``url`` is ``redis://``, ``rediss://`` (TLS) or ``unix://``. Each command
    waits at most ``timeout_s`` (connecting included); a failure makes the next
    ``cooldown_s`` of calls fail at once, then Redis is tried again.
    """

    name = "redis"

    def __init__(
        self,
        url: str,
        ttl_s: float,
        timeout_s: float = 0.1,
        *,
        cooldown_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.where = masked(url)
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._down_until = float("-inf")
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        # from_url builds a plain ConnectionPool (see the module's docstring).
        self.client: redis.Redis = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )

    def get(self, key: str) -> bytes | None:
        value = self._call(lambda: self.client.get(key))
        return None if value is None else bytes(value)

    def set(self, key: str, value: bytes) -> None:
        self._call(lambda: self.client.set(key, value, px=self.ttl_ms))

    def claim(self, key: str, ttl_s: float) -> bool:
        ttl_ms = max(1, round(ttl_s * 1000))
        return (
            self._call(lambda: self.client.set(key + ":lock", b"1", nx=True, px=ttl_ms)) is not None
        )

    def release(self, key: str) -> None:
        # Not checked against the holder: a lock that outlived its ttl and was
        # taken by another worker can be dropped early, which costs one extra
        # model call, not a wrong answer.
        self._call(lambda: self.client.delete(key + ":lock"))

    def close(self) -> None:
        self.client.close()

    def _call(self, command: Callable[[], Any]) -> Any:
        if self._clock() < self._down_until:
            raise StoreUnavailable(f"{self.where} failed less than {self.cooldown_s} s ago")
        try:
            return command()
        except self._errors as exc:
            self._down_until = self._clock() + self.cooldown_s
            raise StoreError(f"{self.where}: {type(exc).__name__}: {exc}") from exc
