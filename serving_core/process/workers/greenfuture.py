"""``GreenFuture``: a future the model thread resolves and a greenlet waits on.

A request greenlet cannot wait on a ``concurrent.futures.Future``: its native
condition variable would block the hub and every other request. The batcher
hands out ``GreenFuture`` instead, which the model thread resolves as usual
and which wakes its greenlet through the hub's async watcher, the one
thread-safe way into a gevent loop.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any, cast

import gevent
from gevent.hub import Waiter, get_hub


class _Wakeups:
    """Futures resolved on other threads, handed to the hub's loop to wake their greenlets."""

    def __init__(self) -> None:
        self.resolved: deque[GreenFuture] = deque()
        self.watcher: Any = gevent.get_hub().loop.async_()
        self.watcher.start(self._wake)

    def post(self, future: Future[Any]) -> None:
        # deque.append is atomic, and ``send`` is the async watcher's thread-safe call.
        # Only GreenFuture registers this callback.
        self.resolved.append(cast(GreenFuture, future))
        self.watcher.send()

    def _wake(self) -> None:
        resolved = self.resolved
        while resolved:
            waiters = resolved.popleft().waiters
            if waiters:
                # A copy: each greenlet switched to removes its own waiter.
                for waiter in tuple(waiters):
                    waiter.switch(None)


_wakeups: _Wakeups | None = None


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
        global _wakeups  # noqa: PLW0603 - one hub per worker process, made on first use
        super().__init__()
        if _wakeups is None:
            _wakeups = _Wakeups()
        self.add_done_callback(_wakeups.post)

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
