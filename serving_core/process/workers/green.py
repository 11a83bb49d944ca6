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
- Fair accepting. A busy hub loops back to its listener faster than an idle
  worker wakes up, so a burst of new connections could all land on one
  worker (8 of 8 in one of 12 bursts measured), and with keep-alive they stay
  there, halving the service. Workers count their open connections in memory
  shared with the master; one that would hold more than an equal share plus
  one stops accepting, letting the others take what is pending, until it is
  back within its share or ``ACCEPT_PAUSE_MAX_S`` has passed (a stuck or
  restarting sibling never stalls it longer).
- A request greenlet cannot wait on a ``concurrent.futures.Future``: its
  native condition variable would block the hub and every other request. The
  batcher hands out ``GreenFuture`` instead, which the model thread resolves
  as usual and which wakes its greenlet through the hub's async watcher, the
  one thread-safe way into a gevent loop.
- Slow clients (``uploads``): each request body must arrive within
  ``SERVING_BODY_TIMEOUT_S``, and near ``SERVING_WORKER_CONNECTIONS`` each new
  connection cuts the one that has waited longest on its client.

Selected by ``SERVING_WORKER_CLASS=gevent`` (the default). What still runs on
the hub, and so blocks every request of the worker while it runs, is CPU work
in Python: validation, ``preprocess``, ``postprocess``. Keep them short, or
choose ``SERVING_WORKER_CLASS=gthread``.
"""

from __future__ import annotations

import ctypes
import mmap
import socket
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, cast

import gevent
from gevent import monkey
from gevent.hub import Waiter, get_hub
from gevent.lock import Semaphore
from gevent.server import StreamServer
from gunicorn.workers import ggevent
from gunicorn.workers.ggevent import GeventWorker

from serving_core.process.drain import DrainingWorker
from serving_core.process.workers.uploads import Connections, TimedBody
from serving_core.runtime import Runtime

ACCEPT_PAUSE_S = 0.005  # how often a paused worker looks again
ACCEPT_PAUSE_MAX_S = 0.05  # the longest it leaves new connections to its siblings
WATCH_AFTER_S = 0.05  # how long a request waits before its client's socket is watched


class ConnectionShares:
    """Each worker's open connections, in memory the master shares with its workers.

    The master gives each worker a slot when it creates it (before fork) and
    frees it when the worker exits; a worker writes only its own slot.
    """

    def __init__(self, workers: int) -> None:
        # Anonymous shared memory: forked workers see the same pages, and no
        # file is needed (the chart's root filesystem is read-only).
        self._memory = mmap.mmap(-1, ctypes.sizeof(ctypes.c_int) * workers)
        self.counts: Any = (ctypes.c_int * workers).from_buffer(self._memory)
        self.owners: list[object | None] = [None] * workers  # the master's view

    def claim(self, worker: object) -> int | None:
        for slot, owner in enumerate(self.owners):
            if owner is None:
                self.owners[slot] = worker
                self.counts[slot] = 0
                return slot
        return None

    def release(self, worker: object) -> None:
        for slot, owner in enumerate(self.owners):
            if owner is worker:
                self.owners[slot] = None
                self.counts[slot] = 0

    def over_share(self, slot: int) -> bool:
        """Whether ``slot`` holds more than an equal share plus one."""
        counts = self.counts
        return bool(counts[slot] > sum(counts) / len(counts) + 1)


_shares: ConnectionShares | None = None


def share_connections(workers: int) -> None:
    """In the master, before the first fork: let ``workers`` gevent workers balance."""
    global _shares  # noqa: PLW0603 - one master per process
    _shares = ConnectionShares(workers) if workers > 1 else None


def worker_exited(worker: object) -> None:
    """gunicorn ``child_exit`` (master): free the dead worker's slot."""
    if _shares is not None:
        _shares.release(worker)


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
    # one slot left all but the last of them waiting for their deadline.
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
            # gevent Event would add a callback round and a Timeout object per wait
            # (~15 -> ~10 us of CPU a wait and wake-up, measured). Nothing else runs
            # on the hub between the check above and the wait.
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


def watch_client(sock: Any, on_gone: Callable[[], None]) -> Callable[[], None]:
    """Call ``on_gone`` if the client closes its connection while its request waits
    for the model; returns what stops watching. An io watcher on the hub, so a wait
    costs nothing until the socket turns readable: then a greenlet peeks, and an
    end of stream (or a reset) means the client has gone. Data means a pipelined
    request, which says nothing: the watch ends there. Without this, the requests
    of clients that gave up (a storm's connections, closed) keep their places in
    the queue and the model runs them for nobody, while new requests are refused.

    The io watcher starts only once the request has waited ``WATCH_AFTER_S``:
    making one cost two system calls (libev checks the descriptor, then adds it
    to epoll, which already has it), and most requests are answered sooner. A
    client that hangs up is noticed that much later; a timer costs none."""
    try:
        fd = sock.fileno()
    except (AttributeError, OSError):
        return _nothing
    if fd < 0:
        return _nothing
    loop = get_hub().loop
    timer = loop.timer(WATCH_AFTER_S)
    watcher: Any = None

    def peek() -> None:
        try:
            gone = sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            gone = True
        if gone:
            on_gone()

    def readable() -> None:
        watcher.stop()
        gevent.spawn(peek)

    def watch() -> None:
        nonlocal watcher
        watcher = loop.io(fd, 1)  # 1: readable
        watcher.start(readable)

    def stop() -> None:
        timer.close()
        if watcher is not None:
            watcher.close()

    timer.start(watch)
    return stop


def _nothing() -> None:
    pass


class _FairServer(StreamServer):  # type: ignore[misc]
    """gevent's stream server, pausing accepts while its worker holds more than its share."""

    slot: int | None = None
    # This worker's open client connections, over all its listeners; also the
    # adaptive batcher's bound on who may still send.
    open_connections = 0
    connections: Connections | None = None  # set in the worker, after fork

    def do_handle(self, *args: Any) -> None:
        # Counted here, at accept, not when the connection's greenlet first runs:
        # several accepts can come before any of those greenlets does.
        self._count(+1)
        if _FairServer.connections is not None:
            _FairServer.connections.make_room(_FairServer.open_connections)
        super().do_handle(*args)
        if self._over_share():
            self.stop_accepting()
            self._pause(time.monotonic() + ACCEPT_PAUSE_MAX_S)

    def do_close(self, *args: Any) -> None:
        try:
            super().do_close(*args)
        finally:
            self._count(-1)

    def _count(self, change: int) -> None:
        _FairServer.open_connections += change
        if _shares is not None and self.slot is not None:
            _shares.counts[self.slot] += change

    def _over_share(self) -> bool:
        shares, slot = _shares, self.slot
        return shares is not None and slot is not None and shares.over_share(slot)

    def _pause(self, until: float) -> None:
        timer = self.loop.timer(ACCEPT_PAUSE_S)
        timer.start(self._resume, timer, until)

    def _resume(self, timer: Any, until: float) -> None:
        timer.close()
        if not self.started:
            return
        if self._over_share() and time.monotonic() < until:
            self._pause(until)  # still ahead: leave what is pending to the others a while longer
        else:
            self.start_accepting()


class GreenWorker(DrainingWorker, GeventWorker):  # type: ignore[misc]
    # How a request greenlet notices that its client has gone; handed to the service
    # in post_fork. What it waits on is RUNTIME's.
    watch_client = staticmethod(watch_client)
    # SERVING_BODY_TIMEOUT_S; post_fork sets the configured value.
    body_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Runs in the master, before this worker's fork.
        self.slot = _shares.claim(self) if _shares is not None else None

    def patch(self) -> None:
        monkey.patch_all(thread=False, subprocess=False)
        from gevent import socket

        # As gunicorn's gevent worker does: re-wrap the inherited listeners.
        self.sockets: list[Any] = [
            socket.socket(s.FAMILY, socket.SOCK_STREAM, fileno=s.sock.detach())
            for s in self.sockets
        ]

    def init_process(self) -> None:
        _FairServer.slot = self.slot
        self.connections = _FairServer.connections = Connections(self.worker_connections)
        ggevent.StreamServer = _FairServer  # what GeventWorker.run builds, in this process
        super().init_process()

    def open_connections(self) -> int:
        """This worker's open client connections, each of which may still send a
        request: the adaptive batcher stops waiting once all of theirs are queued."""
        return _FairServer.open_connections

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
            # the read does not yield either: without this, one connection kept the
            # hub while the others' requests waited up to seconds (wrk c=32 on cached
            # answers: p99 1.1 s, timeouts).
            gevent.sleep(0)


def defer_wake(wake: Callable[[], None]) -> object:
    """Run ``wake`` once the hub has run every greenlet that is ready now
    (``Batcher.defer_wake``): the requests read in this turn of the loop reach
    the model thread with one wake-up."""
    return get_hub().loop.run_callback(wake)


def _spawn(target: Callable[[], None]) -> None:
    gevent.spawn(target)


# How the gevent worker's requests wait: on GreenFuture, gevent's lock, greenlets.
RUNTIME = Runtime(
    "gevent", new_future=GreenFuture, new_lock=Semaphore, spawn=_spawn, defer_wake=defer_wake
)
