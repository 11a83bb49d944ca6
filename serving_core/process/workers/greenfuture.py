"""``GreenFuture``: a future the model thread resolves and a greenlet waits on.

A request greenlet cannot wait on a ``concurrent.futures.Future``: its native
condition variable would block the hub and every other request. The batcher
hands out ``GreenFuture`` instead, which the model thread resolves as usual
and which wakes its greenlet through the hub's async watcher, the one
thread-safe way into a gevent loop.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Protocol, cast

import gevent
from gevent.hub import Waiter, get_hub


class HubCall(Protocol):
    """A call from another thread to start on the hub (``hubcalls.HubCall``)."""

    def start(self) -> None: ...


class _Wakeups:
    """Futures resolved and signals set on other threads, handed to the hub's loop to
    wake their greenlets."""

    def __init__(self) -> None:
        self.resolved: deque[GreenFuture] = deque()
        self.signalled: deque[GreenSignal] = deque()
        self.calls: deque[HubCall] = deque()
        self.watcher: Any = gevent.get_hub().loop.async_()
        self.watcher.start(self._wake)
        # One ``send`` until the hub has run ``_wake``: the decoder's thread sets a
        # signal per stream per step, and each send is a system call that gives up
        # the GIL. Cleared by the hub before it drains, so a post after the drain
        # began sends again.
        self.sent = False

    def post(self, future: Future[Any]) -> None:
        # deque.append is atomic, and ``send`` is the async watcher's thread-safe call.
        # Only GreenFuture registers this callback.
        self.resolved.append(cast(GreenFuture, future))
        self._send()

    def post_signal(self, signal: GreenSignal) -> None:
        self.signalled.append(signal)
        self._send()

    def post_call(self, call: HubCall) -> None:
        self.calls.append(call)
        self._send()

    def _send(self) -> None:
        if not self.sent:
            self.sent = True
            self.watcher.send()

    def _wake(self) -> None:
        self.sent = False
        resolved = self.resolved
        while resolved:
            waiters = resolved.popleft().waiters
            if waiters:
                # A copy: each greenlet switched to removes its own waiter.
                for waiter in tuple(waiters):
                    waiter.switch(None)
        signalled = self.signalled
        while signalled:
            signalled.popleft().wake()
        calls = self.calls
        while calls:
            calls.popleft().start()


_wakeups: _Wakeups | None = None


def prepare() -> None:
    """Made on the hub's own thread, before another thread posts to it (a gRPC front's
    ``hubcalls.call``): made there on first use, it would watch that thread's loop."""
    _the_wakeups()


def post_call(call: HubCall) -> None:
    """From any thread: start ``call`` on the hub (``hubcalls``)."""
    wakeups = _wakeups
    if wakeups is None:
        raise RuntimeError("the hub's wake-ups were not prepared on the hub (prepare())")
    wakeups.post_call(call)


def _the_wakeups() -> _Wakeups:
    global _wakeups  # noqa: PLW0603 - one hub per worker process, made on first use
    if _wakeups is None:
        _wakeups = _Wakeups()
    return _wakeups


class GreenFuture(Future[Any]):
    """A ``concurrent.futures.Future`` whose ``result()`` waits as a greenlet.

    Created on the hub (by a request greenlet), resolved anywhere: the model
    thread's ``set_result``/``set_exception``, or the greenlet's own ``cancel``.
    Its state stays ``Future``'s own, under that class's native lock, which
    both threads hold only for a few instructions.
    """

    # A gevent Waiter per greenlet waiting in result(): usually one, but the
    # cache's single flight hands one future to every identical request, and
    # one slot would leave all but the last of them waiting for their deadline.
    waiters: list[Any] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.add_done_callback(_the_wakeups().post)

    def result(self, timeout: float | None = None) -> Any:
        if not self.done() and (timeout is None or timeout > 0):
            # A Waiter, switched to from the hub by the wake-up or by the timer: a
            # gevent Event would add a callback round and a Timeout object to every
            # wait. Nothing else runs on the hub between the check above and the wait.
            waiter = Waiter()
            waiters = self.waiters
            if waiters is None:
                waiters = self.waiters = []
            waiters.append(waiter)
            timer = None
            if timeout is not None:
                timer = get_hub().loop.timer(timeout)
                timer.start(waiter.switch, None)
            try:
                waiter.get()
            finally:
                waiters.remove(waiter)
                if timer is not None:
                    timer.close()
        # Done by now, or it timed out: Future raises its own TimeoutError then.
        return super().result(timeout=0)


class GreenSignal:
    """A ``runtime.Signal`` a greenlet waits on and any thread sets: a stream's request
    waits on one for each event the decoder's thread puts, with no future per event.

    ``set`` marks it and, when a greenlet waits, hands it to the hub; ``wait``
    looks at the mark before it blocks and after it wakes. A wake-up meant for an
    earlier wait may reach a later one: it then finds no mark and waits on.
    """

    __slots__ = ("_marked", "_waiter", "_wakeups")

    def __init__(self) -> None:
        self._marked = False
        self._waiter: Any = None
        self._wakeups = _the_wakeups()

    def set(self) -> None:
        self._marked = True
        if self._waiter is not None:
            self._wakeups.post_signal(self)

    def wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.switch(None)

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        loop = get_hub().loop
        while not self._marked:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            waiter = self._waiter = Waiter()
            if self._marked:  # set before it saw the waiter
                break
            timer = loop.timer(left)
            timer.start(waiter.switch, None)
            try:
                waiter.get()
            finally:
                timer.close()
                self._waiter = None
        woken, self._marked = self._marked, False
        return woken
