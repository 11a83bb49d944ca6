"""How this process waits: on threads, or on greenlets on gevent's hub.

A gthread worker, the job worker and a batch run wait on native threads; a
gevent worker's requests are greenlets, and a greenlet that waited on a native
lock or future would stall every other request of its worker. So the few
places below ``process`` that wait, lock or start a background task take a
``Runtime`` instead of asking ``gevent.monkey`` themselves: the process layer,
the only one that imports gevent, builds the gevent one and passes it down.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal


def _thread(target: Callable[[], None]) -> None:
    threading.Thread(target=target, name="serving-task", daemon=True).start()


@dataclass(frozen=True)
class Runtime:
    """What a request, a model-process link or a pipeline stage call waits on."""

    kind: Literal["threads", "gevent"]
    # What a waiting request waits on: its result is set from the model thread.
    new_future: Callable[[], Future[Any]] = Future
    # A lock that may be held across a blocking send.
    new_lock: Callable[[], contextlib.AbstractContextManager[Any]] = threading.Lock
    # Starts ``target`` beside the caller and returns at once (a daemon thread, or a
    # greenlet on the caller's hub).
    spawn: Callable[[Callable[[], None]], None] = _thread
    # How a request wakes the model thread (``Batcher.defer_wake``); None: at once.
    defer_wake: Callable[[Callable[[], None]], object] | None = None

    @property
    def green(self) -> bool:
        return self.kind == "gevent"


THREADS = Runtime("threads")
