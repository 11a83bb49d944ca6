"""Where the inference cache keeps its entries: each worker's memory, or Redis.

A store holds opaque bytes under string keys, each for ``ttl_s`` seconds. It
raises ``StoreError`` for any failure; ``Cache`` turns that into a miss and a
counted error, never a failed request.

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

import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import redis


class StoreError(Exception):
    """The store could not answer (unreachable, timed out, refused)."""


class StoreUnavailable(StoreError):
    """The store failed moments ago and is not being tried again yet."""


class Store(Protocol):
    name: str

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes) -> None: ...

    def claim(self, key: str, ttl_s: float) -> bool:
        """Take a short lock on ``key`` for ``ttl_s``; False if someone else holds it."""
        ...

    def release(self, key: str) -> None: ...


class MemoryStore:
    """An LRU of at most ``max_entries`` entries, each kept ``ttl_s`` seconds; thread-safe.

    Its native lock is held only for a few dict operations, never across a wait,
    so the model thread and a gevent hub can share it.
    """

    name = "memory"

    def __init__(
        self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries={max_entries}; a memory store holds at least 1")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> bytes | None:
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires, value = entry
            if now >= expires:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return value

    def set(self, key: str, value: bytes) -> None:
        expires = self._clock() + self.ttl_s
        with self._lock:
            self._entries[key] = (expires, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def claim(self, key: str, ttl_s: float) -> bool:
        # One process: Cache's own in-flight table already coalesces.
        return True

    def release(self, key: str) -> None:
        pass


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

        self.where = _without_password(url)
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


def _without_password(url: str) -> str:
    """``url`` for messages: a ``redis://user:secret@host`` URL loses its credentials."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
