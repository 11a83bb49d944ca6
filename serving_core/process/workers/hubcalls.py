"""Calls from native threads run as greenlets on the gevent worker's hub.

The gRPC front (``grpc.front``) serves its calls on grpcio's native threads,
since grpcio cannot run on gevent's loop without monkey-patching ``threading``,
which the model thread forbids (``green``). A call's work that touches the
service (admission, the cache, the batcher, the payload log) must run where
the worker's HTTP requests run: as a greenlet on the hub, waiting on
``GreenFuture`` and gevent's locks, so that a gRPC row and an HTTP row wait
in the same queue and ride in the same batch. ``call`` hands a function to
the hub through the async watcher that wakes the futures (one wake-up for
every call and future posted in the same turn) and blocks its native thread,
GIL released, until the greenlet has returned or raised.

At the worker's exit the hub stops running greenlets, and a call still in
hand would block its thread, and the interpreter's exit that joins it, for
good: ``abandon`` makes every such wait raise ``NotReady`` instead.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import gevent

from serving_core.errors import NotReady
from serving_core.process.workers import greenfuture

# How often a waiting thread looks whether the worker has abandoned its calls.
_LOOK_S = 0.25
_abandoned = threading.Event()

T = TypeVar("T")


class HubCall:
    """One function handed to the hub, and what it came to."""

    __slots__ = ("_context", "_done", "_error", "_fn", "_result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn
        # The caller's context variables (a trace's current span), as a thread's spawn.
        self._context = contextvars.copy_context()
        # A native lock held until the greenlet is done: the hub releases it, the thread's
        # acquire returns. Not an ``Event``: its set and wait each take its condition's
        # lock and make a waiter lock, where this is one release and one acquire.
        # (``threading`` is not patched here, so the lock is native.)
        self._done = threading.Lock()
        self._done.acquire()
        self._result: Any = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """On the hub: run the function in a greenlet of its own."""
        gevent.spawn(self._context.run, self._run)

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as exc:  # raised again in the caller's thread
            self._error = exc
        finally:
            self._done.release()

    def wait(self) -> Any:
        while not self._done.acquire(timeout=_LOOK_S):
            if _abandoned.is_set():
                raise NotReady("this worker is shutting down; retry on another instance")
        if self._error is not None:
            # Its own traceback, which grpc's abort relies on only for its type.
            raise self._error
        return self._result


def call(fn: Callable[[], T]) -> T:
    """``fn()`` as a greenlet on this worker's hub, from any other native thread."""
    if threading.current_thread() is threading.main_thread():
        return fn()  # the hub's own thread: a request greenlet already
    hub_call = HubCall(fn)
    greenfuture.post_call(hub_call)
    result: T = hub_call.wait()
    return result


def abandon() -> None:
    """At worker exit, once the hub no longer runs: the calls still waiting give up."""
    _abandoned.set()
