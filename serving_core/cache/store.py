"""Where the inference cache keeps its entries: the ``Store`` interface and its errors.

A store holds opaque bytes under string keys, each for ``ttl_s`` seconds. It
raises ``StoreError`` for any failure; ``Cache`` turns that into a miss and a
counted error, never a failed request. Each worker's memory (``memorystore``)
when SERVING_CACHE_URL is empty; else the store its scheme picks (``stores``).
"""

from __future__ import annotations

from typing import Protocol


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
