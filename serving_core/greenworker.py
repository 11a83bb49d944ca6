"""gunicorn's gevent worker, with the model thread left a real thread.

Why gevent is the default: on a small machine every CPU cycle a request spends
outside the model is taken from the model. With gthread, each request crosses
four OS threads (the poller, a pool thread, the model thread and back), and
every crossing is a GIL hand-off and a context switch; a worker's 64 request
threads also fight the model thread for the GIL. Here one OS thread (the
gevent hub) parses, validates and answers every request of the worker as
greenlets, and the model thread is the only other thread. Measured on the
2-core VM: a worker's CPU per echo request ~700 -> ~390 us; MiniLM at
concurrency 32, back to back, 0.76 -> 0.80 x the bare-model limit; at 2x
capacity, 277 -> 318 answered requests/s (single runs), since a refusal costs
a greenlet, not a thread.

What differs from ``gunicorn -k gevent``:

- ``threading`` is not monkey-patched. The model thread must stay a native
  thread (torch runs there, in parallel with the hub), and the batcher's locks
  must stay native locks shared by both threads. Sockets, ``time.sleep``,
  ``select`` and DNS are patched as usual, so a handler's network calls in
  ``preprocess`` yield to other requests instead of blocking the worker.
- A request greenlet cannot wait on a ``concurrent.futures.Future``: its
  native condition variable would block the hub and every other request. The
  batcher hands out ``GreenFuture`` instead, which the model thread resolves
  as usual and which wakes its greenlet through the hub's async watcher, the
  one thread-safe way into a gevent loop.

Selected by ``SERVING_WORKER_CLASS=gevent`` (the default). What still runs on
the hub, and so blocks every request of the worker while it runs, is CPU work
in Python: validation, ``preprocess``, ``postprocess``. Keep them short, or
choose ``SERVING_WORKER_CLASS=gthread``.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any, cast

import gevent
from gevent import monkey
from gevent.event import Event
from gunicorn.workers.ggevent import GeventWorker

from . import arrival, wire

wire.install()

SERVICE_KEY = "serving_core"


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
            resolved.popleft().ready.set()


_wakeups: _Wakeups | None = None


class GreenFuture(Future[Any]):
    """A ``concurrent.futures.Future`` whose ``result()`` waits as a greenlet.

    Created on the hub (by a request greenlet), resolved anywhere: the model
    thread's ``set_result``/``set_exception``, or the greenlet's own ``cancel``.
    Its state stays ``Future``'s own, under that class's native lock, which
    both threads hold only for a few instructions.
    """

    def __init__(self) -> None:
        global _wakeups  # noqa: PLW0603 - one hub per worker process, made on first use
        super().__init__()
        if _wakeups is None:
            _wakeups = _Wakeups()
        self.ready = Event()
        self.add_done_callback(_wakeups.post)

    def result(self, timeout: float | None = None) -> Any:
        if not self.done():
            self.ready.wait(timeout)
        # Done by now, or it timed out: Future raises its own TimeoutError then.
        return super().result(timeout=0)


class GreenWorker(GeventWorker):  # type: ignore[misc]
    def patch(self) -> None:
        monkey.patch_all(thread=False, subprocess=False)
        from gevent import socket

        # As gunicorn's gevent worker does: re-wrap the inherited listeners.
        self.sockets: list[Any] = [
            socket.socket(s.FAMILY, socket.SOCK_STREAM, fileno=s.sock.detach())
            for s in self.sockets
        ]

    def init_process(self) -> None:
        self.open_connections = 0
        arrival.count_connections_with(lambda: self.open_connections)
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # The app was built before fork; from here on its request greenlets wait as greenlets.
        service = self.wsgi.extensions.get(SERVICE_KEY)
        if service is not None and service.batcher is not None:
            service.batcher.new_future = GreenFuture

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        self.open_connections += 1
        try:
            super().handle(listener, client, addr)
        finally:
            self.open_connections -= 1
