"""The inference cache's shared stores, by the scheme of SERVING_CACHE_URL.

``STORES`` maps a scheme to the module of its store, imported only when a URL
of that scheme is used. A store's module has the functions of ``StoreBackend``: it
checks its own URL and opens the store. An empty URL is each worker's memory
(``memorystore.MemoryStore``). Another store is one module and one line here; the
chart's schema is checked against this table (tests/deploy/test_chart_schemes.py).
"""

from __future__ import annotations

import importlib
from typing import Protocol, cast

from serving_core.cache.store import Store
from serving_core.settings.secrets import masked

STORES: dict[str, str] = {
    "redis": "serving_core.cache.redisstore",
    "rediss": "serving_core.cache.redisstore",
    "unix": "serving_core.cache.redisstore",
}

VARIABLE = "SERVING_CACHE_URL"


class StoreBackend(Protocol):
    """What a module of ``STORES`` provides. ``check`` raises ``ValueError`` saying what
    is wrong with the URL and how to fix it, starting with the URL ``masked`` and
    quoted (``repr``), which ``check`` here prefixes with the variable; it connects
    to nothing, so it runs at start-up before a model loads."""

    def check(self, url: str) -> None: ...

    def open_store(self, url: str, ttl_s: float) -> Store: ...


def backend(url: str) -> StoreBackend:
    """The module of ``url``'s store; ``ValueError`` naming SERVING_CACHE_URL if none."""
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in STORES:
        schemes = ", ".join(f"{known}://" for known in STORES)
        raise ValueError(
            f"{VARIABLE}={masked(url)!r}: {scheme + sep if sep else 'no scheme'} names no "
            f"cache store; use a URL of one of {schemes}, or leave it empty for each "
            "worker's memory"
        )
    return cast(StoreBackend, importlib.import_module(STORES[scheme]))


def check(url: str) -> None:
    """SERVING_CACHE_URL, checked by its store (an empty one is memory, and fine)."""
    if not url:
        return
    store = backend(url)
    try:
        store.check(url)
    except ValueError as error:
        raise ValueError(f"{VARIABLE}={error}") from None


def open_store(url: str, ttl_s: float) -> Store:
    """The shared store SERVING_CACHE_URL names; ``ValueError`` if its store refuses it."""
    check(url)
    return backend(url).open_store(url, ttl_s)
