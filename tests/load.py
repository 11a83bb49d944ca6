"""Client threads that send requests back to back until stopped: the load under which
the process tests drain, recycle and reload a server. Each test's subclass says how
one client sends (``_client``) and what it records of each request (``sent``)."""

from __future__ import annotations

import threading
from typing import Generic, Self, TypeVar

Record = TypeVar("Record")


class ClientThreads(Generic[Record]):
    """``clients`` daemon threads each running ``_client(n)``, started by ``start``
    (or entering ``with``) and told to stop by ``stop``; what they record, under
    ``_lock``, is ``sent``."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.sent: list[Record] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(clients)
        ]

    def start(self) -> Self:
        for thread in self._threads:
            thread.start()
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _client(self, n: int) -> None:
        raise NotImplementedError
