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
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, Protocol


def _thread(target: Callable[[], None]) -> None:
    # In a copy of the caller's context: a V2 row or a stage call keeps its request's
    # context variables (``serving_core.context``, the current span).
    run = contextvars.copy_context().run
    threading.Thread(target=run, args=(target,), name="serving-task", daemon=True).start()


def _direct(call: Callable[[], Any]) -> Any:
    return call()


def _nothing() -> None:
    return None


class Signal(Protocol):
    """A wake-up that another thread sets, as often as it likes, and one waiter takes:
    ``wait`` returns once it was set (clearing it) or after ``timeout_s``. A stream's
    request waits on one for each of its events, so it costs no future per event."""

    def set(self) -> None: ...

    def wait(self, timeout_s: float) -> bool: ...


class ThreadSignal:
    """A native thread's ``Signal``."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout_s: float) -> bool:
        woken = self._event.wait(timeout_s)
        # A set between the wake and here is lost, harmlessly: the waiter looks at
        # what it waited for before it waits again.
        self._event.clear()
        return woken


@dataclass(frozen=True)
class Runtime:
    """What a request, a model-process link or a pipeline stage call waits on."""

    kind: Literal["threads", "gevent"]
    # What a waiting request waits on: its result is set from the model thread.
    new_future: Callable[[], Future[Any]] = Future
    # A lock that may be held across a blocking send.
    new_lock: Callable[[], contextlib.AbstractContextManager[Any]] = threading.Lock
    # Starts ``target`` beside the caller, in a copy of its context variables, and
    # returns at once (a daemon thread, or a greenlet on the caller's hub).
    spawn: Callable[[Callable[[], None]], None] = _thread
    # How a request wakes the model thread (``Batcher.defer_wake``); None: at once.
    defer_wake: Callable[[Callable[[], None]], object] | None = None
    # What a stream's request waits on for its next event (set by the decoder's thread).
    new_signal: Callable[[], Signal] = ThreadSignal
    # Runs a call of a front served on native threads of its own (gRPC's) where this
    # runtime's requests run, and returns what it returns (or raises): as it is, on
    # threads; as a greenlet on the hub, the gevent worker's.
    enter: Callable[[Callable[[], Any]], Any] = _direct
    # At worker exit: the calls still in ``enter`` give up (the hub no longer runs).
    abandon: Callable[[], None] = _nothing

    @property
    def green(self) -> bool:
        return self.kind == "gevent"


THREADS = Runtime("threads")
