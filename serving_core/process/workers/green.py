"""gunicorn's gevent worker, with the model thread left a real thread.

Why gevent is the default: on a small machine every CPU cycle a request spends
outside the model is taken from the model. With gthread, each request crosses
four OS threads (the poller, a pool thread, the model thread and back), and
every crossing is a GIL hand-off and a context switch; a worker's 64 request
threads also fight the model thread for the GIL. Here one OS thread (the
gevent hub) parses, validates and answers every request of the worker as
greenlets, and the model thread is the only other thread. So a request costs
the worker less CPU, more of each core is left to the model, and under
overload more is answered, since a refusal costs a greenlet, not a thread
(bench/README.md, "Served throughput and latency").

What differs from ``gunicorn -k gevent``:

- ``threading`` is not monkey-patched. The model thread must stay a native
  thread (torch runs there, in parallel with the hub), and the batcher's locks
  must stay native locks shared by both threads. Sockets, ``time.sleep``,
  ``select`` and DNS are patched as usual, so a handler's network calls in
  ``preprocess`` yield to other requests instead of blocking the worker.
- Fair accepting (``fairaccept``): a worker that holds more than its share of
  the open connections leaves new ones to its siblings for a moment.
- A request greenlet waits on a ``GreenFuture`` (``greenfuture``), which the
  model thread resolves and which wakes the greenlet through the hub; and
  ``clientwatch`` notices a client that hangs up while its request waits.
- Slow clients (``uploads``): each request body must arrive within
  ``SERVING_BODY_TIMEOUT_S``, and near ``SERVING_WORKER_CONNECTIONS`` each new
  connection cuts the one that has waited longest on its client.

Selected by ``SERVING_WORKER_CLASS=gevent`` (the default). What still runs on
the hub, and so blocks every request of the worker while it runs, is CPU work
in Python: validation, ``preprocess``, ``postprocess``. Keep them short, or
choose ``SERVING_WORKER_CLASS=gthread``.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from typing import Any

import gevent
from gevent.hub import get_hub
from gevent.lock import Semaphore
from gunicorn.workers import ggevent
from gunicorn.workers.ggevent import GeventWorker

from serving_core.process.drain import DrainingWorker
from serving_core.process.workers import (
    clientwatch,
    fairaccept,
    greenfuture,
    hubcalls,
    patching,
)
from serving_core.process.workers.fairaccept import FairServer
from serving_core.process.workers.greenfuture import GreenFuture, GreenSignal
from serving_core.process.workers.uploads import Connections, TimedBody
from serving_core.runtime import Runtime


class GreenWorker(DrainingWorker, GeventWorker):  # type: ignore[misc]
    # How a request greenlet notices that its client has gone; handed to the service
    # in post_fork. What it waits on is RUNTIME's.
    watch_client = staticmethod(clientwatch.watch_client)
    # SERVING_BODY_TIMEOUT_S; post_fork sets the configured value.
    body_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Runs in the master, before this worker's fork.
        self.slot = fairaccept.claim_slot(self)

    def patch(self) -> None:
        patching.patch_worker()
        from gevent import socket

        # As gunicorn's gevent worker does: re-wrap the inherited listeners.
        self.sockets: list[Any] = [
            socket.socket(s.FAMILY, socket.SOCK_STREAM, fileno=s.sock.detach())
            for s in self.sockets
        ]

    def load_wsgi(self) -> None:
        super().load_wsgi()
        # Patched, the hub made again: its wake-ups are made here, on its thread,
        # before post_worker_init starts a gRPC front whose threads post to them.
        greenfuture.prepare()

    def init_process(self) -> None:
        FairServer.slot = self.slot
        self.connections = FairServer.connections = Connections(self.worker_connections)
        ggevent.StreamServer = FairServer  # what GeventWorker.run builds, in this process
        super().init_process()

    def open_connections(self) -> int:
        """This worker's open client connections, each of which may still send a
        request: the adaptive batcher stops waiting once all of theirs are queued."""
        return FairServer.open_connections

    # -- slow clients (``uploads``); each runs in the connection's greenlet ------

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        self.connections.opened(client)
        try:
            super().handle(listener, client, addr)
        finally:
            self.connections.closed()

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
        if self.draining:
            req.must_close = True  # a keep-alive client reconnects, elsewhere by now
        conn = self.connections.current()
        if conn is not None:
            self.connections.working(conn)
        body = req.body
        if body is not None:

            def must_close() -> None:
                req.must_close = True  # no keep-alive: the body's rest is not read

            req.body = TimedBody(
                body,
                deadline=time.monotonic() + self.body_timeout_s,
                timeout_s=self.body_timeout_s,
                conn=conn,
                on_fail=must_close,
            )
        try:
            return super().handle_request(listener_name, req, sock, addr)
        finally:
            # gunicorn drains what the app left of the body before the next request,
            # under its keep-alive timeout: from the real body, not on our clock.
            req.body = body
            if conn is not None:
                self.connections.idle(conn)
            # Let the other connections' greenlets run before this one reads its next
            # request. A request that never waits (a cache hit) yields nowhere, and on
            # a fast keep-alive client the next request is already in the socket, so
            # the read does not yield either: without this, one connection keeps the
            # hub while the others' requests wait up to seconds (cached answers at
            # c=32 time out).
            gevent.sleep(0)


def defer_wake(wake: Callable[[], None]) -> object:
    """Run ``wake`` once the hub has run every greenlet that is ready now
    (``Batcher.defer_wake``): the requests read in this turn of the loop reach
    the model thread with one wake-up."""
    return get_hub().loop.run_callback(wake)


def _spawn(target: Callable[[], None]) -> None:
    # In a copy of the caller's context variables, as ``runtime``'s threads: a greenlet
    # starts with empty ones.
    gevent.spawn(contextvars.copy_context().run, target)


# How the gevent worker's requests wait: on GreenFuture, gevent's lock, greenlets.
RUNTIME = Runtime(
    "gevent",
    new_future=GreenFuture,
    new_lock=Semaphore,
    spawn=_spawn,
    defer_wake=defer_wake,
    new_signal=GreenSignal,
    enter=hubcalls.call,
    abandon=hubcalls.abandon,
)
