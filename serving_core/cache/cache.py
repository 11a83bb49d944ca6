"""The inference cache: answers repeated requests without running the model.

One ``Cache`` serves one handler build. Its key is the handler's name,
version and revision (``SERVING_MODEL_REVISION`` and the fetched artifacts'
revision), the caller when entries are per API key, and the canonical
parameters (``key``); its entries are the outputs as orjson bytes, in each
worker's memory or in a shared store (``stores``). A numpy array comes back
from the cache as a list of numbers, which encodes to the same JSON body.

Identical concurrent misses share one model call (``single_flight``):

- In one process, the first request computes and the others wait on a future
  made by ``new_future`` (a ``GreenFuture`` in a gevent worker, so a waiting
  greenlet never blocks the hub). An error about the parameters or the model
  (a 4xx, the handler's exception) reaches them all: they asked the same, and a
  second call would fail the same way at the same cost. An error of the
  leader's own request (``LEADERS_OWN``: its deadline, the admission it met;
  or a cancelled leader) does not: the waiters try again, one of them leading.
- Across workers and replicas, with Redis, the first one to miss also sets a
  short lock key (``SET NX PX``). A worker that finds the lock taken polls
  for the value every ``poll_s`` for up to ``lock_s``, then computes itself.
  The trade-off: a model call saved per concurrent duplicate, for two more
  Redis round trips on every miss (set and delete the lock) and, when the
  other worker is slower than ``lock_s``, up to ``lock_s`` of extra latency.
  ``lock_s=0`` turns it off.

Failures degrade to misses: a store that fails or times out is counted
(``CacheObserver.cache_error``) and the model runs, as if no cache were there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, Literal, Protocol

from serving_core import encoding
from serving_core.cache.key import Keyer
from serving_core.cache.memorystore import MemoryStore
from serving_core.cache.store import Store, StoreError, StoreUnavailable
from serving_core.cache.stores import open_store
from serving_core.errors import DeadlineExceeded, NotReady, Overloaded, RequestTimeout
from serving_core.handler import Handler, Output, handler_name, model_revision
from serving_core.settings import Settings

log = logging.getLogger("serving_core.cache.cache")

CacheResult = Literal["hit", "miss", "coalesced"]
NewFuture = Callable[[], "Future[Any]"]
# Errors that say something of the leading request, not of its parameters: its
# deadline ran out, or admission refused it (a full queue, a model not ready)
# at the moment it came. The requests waiting on it compute again.
LEADERS_OWN = (DeadlineExceeded, Overloaded, NotReady, RequestTimeout)


class _LeaderGaveUp(Exception):
    """Set on the waiters' future when the leader failed for a reason of its own."""


class CacheObserver(Protocol):
    """What the cache reports; ``metrics.metrics.Metrics`` implements it."""

    def cache_request(self, result: CacheResult) -> None: ...

    def cache_error(self, store: str) -> None: ...


class Cache:
    """The cache of one handler's outputs, over ``store``."""

    def __init__(
        self,
        store: Store,
        name: str,
        version: str,
        observer: CacheObserver | None = None,
        new_future: NewFuture = Future,
        *,
        revision: str = "",
        lock_s: float = 1.0,
        poll_s: float = 0.005,
    ) -> None:
        self.store = store
        self.name = name
        self.version = version
        self.observer = observer
        self.lock_s = lock_s
        self.poll_s = poll_s
        self._new_future = new_future
        self.revision = revision
        self._key = Keyer(name, version, revision)
        # Held only to read or change the table, never while waiting.
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future[Any] | None] = {}

    def key_for(self, params: Mapping[str, Any], caller: str | None = None) -> str | None:
        """The key of ``params`` (as asked by ``caller``, when entries are per caller),
        or None when they cannot be cached (not JSON values)."""
        try:
            return self._key(params, caller)
        except TypeError as exc:
            log.debug("not cached: %s", exc)
            return None

    def lookup(
        self, params: Mapping[str, Any], caller: str | None = None
    ) -> tuple[str | None, Output | None]:
        """``(key, output)``: the output on a hit, None on a miss; key None if uncacheable.

        Counts a hit or a miss. For one request use either ``lookup`` then
        ``fill``, or ``key_for`` then ``single_flight``, which looks up itself.
        """
        key = self.key_for(params, caller)
        if key is None:
            return None, None
        output = self._get(key)
        self._count("miss" if output is None else "hit")
        return key, output

    def fill(self, key: str, output: Output) -> Output:
        """Store ``output`` under ``key``; returns it as a hit will (answer the miss with it).

        What a hit returns is the stored JSON decoded: a numpy float32 comes
        back as a Python float, which orjson prints in float64's form (for
        some values ``2.1732194e-6`` where float32's is ``0.0000021732194``).
        Answering the miss with the returned value makes its body the same
        bytes as every later hit's. A failure to store is counted, never raised.
        """
        try:
            value = encoding.dumps(output)
        except TypeError as exc:
            log.debug("not cached: %s", exc)
            return output
        try:
            self.store.set(key, value)
        except StoreError as exc:
            self._error(exc)
        decoded: Output = encoding.loads(value)
        return decoded

    def single_flight(
        self, key: str, compute: Callable[[], Output], *, timeout_s: float | None = None
    ) -> tuple[Output, CacheResult]:
        """The output for ``key``: from the store, from an identical call in flight, or computed.

        Only one ``compute`` runs per key at a time in this process; the others
        wait for its output (or its error, unless ``LEADERS_OWN``: then they try
        again) for up to ``timeout_s`` in all, then raise ``TimeoutError``. A
        computed output is returned as ``fill`` returns it, so a miss, a hit and a
        coalesced request have the same JSON body. Treat the output as read-only:
        it may be shared.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (waited := self._follow(key)) is not None:
            self._count("coalesced")
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                output: Output = waited.result(left)
            except _LeaderGaveUp:
                continue  # lead now, or follow whoever does
            return output, "coalesced"
        try:
            output, result = self._lead(key, compute)
        except BaseException as exc:
            future = self._done(key)
            if future is not None:
                # Not an Exception: the leader was cancelled (GreenletExit, KeyboardInterrupt).
                own = isinstance(exc, LEADERS_OWN) or not isinstance(exc, Exception)
                future.set_exception(_LeaderGaveUp() if own else exc)
            raise
        future = self._done(key)
        if future is not None:
            future.set_result(output)
        self._count(result)
        return output, result

    def _follow(self, key: str) -> Future[Any] | None:
        """What to wait on for ``key``, or None: this caller leads (computes) it."""
        with self._lock:
            if key not in self._in_flight:
                # The future is made by the first request to wait on it: most keys
                # are never asked for twice at once, and a future costs its wake-up.
                self._in_flight[key] = None
                return None
            waited = self._in_flight[key] or self._new_future()
            self._in_flight[key] = waited
            return waited

    def followed(self, key: str) -> bool:
        """Whether an identical request waits on the call in flight for ``key``."""
        return self._in_flight.get(key) is not None

    # -- internals ------------------------------------------------------------

    def _lead(self, key: str, compute: Callable[[], Output]) -> tuple[Output, CacheResult]:
        output = self._get(key)
        if output is not None:
            return output, "hit"
        claimed = self.lock_s <= 0 or self._claim(key)
        if not claimed:
            output = self._await_other(key)
            if output is not None:
                return output, "coalesced"
        try:
            output = self.fill(key, compute())
        finally:
            if self.lock_s > 0 and claimed:
                self._release(key)
        return output, "miss"

    def _get(self, key: str) -> Output | None:
        try:
            value = self.store.get(key)
        except StoreError as exc:
            self._error(exc)
            return None
        return None if value is None else self._decode(key, value)

    def _decode(self, key: str, value: bytes) -> Output | None:
        try:
            output = encoding.loads(value)
        except encoding.JSONDecodeError:
            output = None
        if not isinstance(output, dict):
            self._error(StoreError(f"{key} holds no JSON object; ignored"))
            return None
        return output

    def _claim(self, key: str) -> bool:
        try:
            return self.store.claim(key, self.lock_s)
        except StoreError as exc:
            self._error(exc)
            return True  # compute without the lock; the store is failing anyway

    def _release(self, key: str) -> None:
        try:
            self.store.release(key)
        except StoreError as exc:
            self._error(exc)

    def _await_other(self, key: str) -> Output | None:
        # time.sleep, looked up now: gevent's patch makes it yield to other greenlets.
        deadline = time.monotonic() + self.lock_s
        while time.monotonic() < deadline:
            time.sleep(self.poll_s)
            try:
                value = self.store.get(key)
            except StoreError as exc:
                self._error(exc)
                return None
            if value is not None:
                return self._decode(key, value)
        return None

    def _done(self, key: str) -> Future[Any] | None:
        """Ends ``key``'s flight: its future, if anyone waits on it."""
        with self._lock:
            return self._in_flight.pop(key)

    def _count(self, result: CacheResult) -> None:
        if self.observer is not None:
            self.observer.cache_request(result)

    def _error(self, exc: StoreError) -> None:
        # A store in its cool-down fails every call at once: one warning per outage.
        level = logging.DEBUG if isinstance(exc, StoreUnavailable) else logging.WARNING
        log.log(level, "cache %s: %s (answered as a miss)", self.store.name, exc)
        if self.observer is not None:
            self.observer.cache_error(self.store.name)


def from_settings(
    settings: Settings,
    handler: Handler,
    observer: CacheObserver | None = None,
    new_future: NewFuture = Future,
) -> Cache | None:
    """The handler's cache as configured, or None: cache off, or ``cacheable = False``."""
    if not handler.cacheable:
        return None
    store: Store
    if settings.cache_url:
        store = open_store(settings.cache_url, settings.cache_ttl_s)
    elif settings.cache_size > 0:
        store = MemoryStore(settings.cache_size, settings.cache_ttl_s)
    else:
        return None
    return Cache(
        store,
        handler_name(handler),
        handler.version,
        observer,
        new_future,
        revision=model_revision(handler, settings.model_revision),
    )
