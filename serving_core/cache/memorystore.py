"""The inference cache in each worker's memory: an LRU with a time to live."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable


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
