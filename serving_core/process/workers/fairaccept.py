"""Fair accepting: gevent workers share new connections out between them.

A busy hub loops back to its listener faster than an idle worker wakes up, so
a burst of new connections can all land on one worker, and with keep-alive they
stay there, halving the service. Workers count their open connections in
memory shared with the master; one that is full (one more connection would put
it above an equal share of them all, rounded up) stops accepting, letting the
others take what is pending, until it is no longer full or
``ACCEPT_PAUSE_MAX_S`` has passed (a stuck or restarting sibling never stalls
it longer).

Exactly an equal share, not "an equal share plus one": with that slack 32
keep-alive connections on 2 workers mostly split 15/17, and the worker with 17
runs batches of 16 and 1 (SERVING_MAX_BATCH_SIZE=16) while its sibling's model
waits for 15, for as long as the connections stay; the exact bound splits them
16/16 (bench/README.md, "Fair accepting"). The full worker pauses before it
takes one too many, not after, so a burst's last connection cannot overshoot.

The master calls ``share_connections`` before the first fork and
``worker_exited`` for each dead worker; a worker takes its slot with
``claim_slot`` (in the master, as gunicorn creates it) and accepts through
``FairServer``.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import time
from typing import Any

from gevent.server import StreamServer

from serving_core.process.workers.uploads import Connections

ACCEPT_PAUSE_S = 0.005  # how often a paused worker looks again
ACCEPT_PAUSE_MAX_S = 0.05  # the longest it leaves new connections to its siblings


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

    def full(self, slot: int) -> bool:
        """Whether one more connection would put ``slot`` above an equal share of all
        the connections then open, rounded up. Never true of every slot at once: the
        one with the fewest holds at most ``total // slots``."""
        counts = self.counts
        return bool(counts[slot] + 1 > math.ceil((sum(counts) + 1) / len(counts)))


_shares: ConnectionShares | None = None


def share_connections(workers: int) -> None:
    """In the master, before the first fork: let ``workers`` gevent workers balance."""
    global _shares  # noqa: PLW0603 - one master per process
    _shares = ConnectionShares(workers) if workers > 1 else None


def claim_slot(worker: object) -> int | None:
    """In the master, as it creates ``worker``: its slot, or None (no balancing)."""
    return _shares.claim(worker) if _shares is not None else None


def worker_exited(worker: object) -> None:
    """gunicorn ``child_exit`` (master): free the dead worker's slot."""
    if _shares is not None:
        _shares.release(worker)


class FairServer(StreamServer):  # type: ignore[misc]
    """gevent's stream server: no accepting while its worker is full (``ConnectionShares.full``)."""

    slot: int | None = None
    # This worker's open client connections, over all its listeners; also the
    # adaptive batcher's bound on who may still send.
    open_connections = 0
    connections: Connections | None = None  # set in the worker, after fork
    paused = False  # full: the rest of the backlog is left to the siblings

    def do_read(self) -> Any:
        # gevent's accept loop takes up to ``max_accept`` (100) connections per
        # wake-up, and goes on after ``stop_accepting``: a burst that reached the
        # backlog before this hub woke would all land here. None ends that loop.
        # Asked before each accept, not after: a count can also fall elsewhere (a
        # sibling's connection closed) between two of this worker's accepts.
        if self.paused:
            return None
        if self._full():
            self.stop_accepting()
            self._pause(time.monotonic() + ACCEPT_PAUSE_MAX_S)
            return None
        return super().do_read()

    def do_handle(self, *args: Any) -> None:
        # Counted here, at accept, not when the connection's greenlet first runs:
        # several accepts can come before any of those greenlets does.
        self._count(+1)
        if FairServer.connections is not None:
            FairServer.connections.make_room(FairServer.open_connections)
        super().do_handle(*args)

    def do_close(self, *args: Any) -> None:
        try:
            super().do_close(*args)
        finally:
            self._count(-1)

    def _count(self, change: int) -> None:
        FairServer.open_connections += change
        if _shares is not None and self.slot is not None:
            _shares.counts[self.slot] += change

    def _full(self) -> bool:
        shares, slot = _shares, self.slot
        return shares is not None and slot is not None and shares.full(slot)

    def _pause(self, until: float) -> None:
        """Paused until the timer's next look (``_resume``), at most until ``until``."""
        self.paused = True
        timer = self.loop.timer(ACCEPT_PAUSE_S)
        timer.start(self._resume, timer, until)

    def _resume(self, timer: Any, until: float) -> None:
        timer.close()
        self.paused = False
        if not self.started:
            return
        full = self._full()
        if full and time.monotonic() < until:
            self._pause(until)  # still full: leave what is pending to the others a while longer
        elif full and self._take_one():
            # The pause ran out, still full: a sibling that takes nothing must not
            # stall new clients. One pending connection is taken here, the rest wait
            # another pause; none pending, and accepting goes on as usual.
            self._pause(time.monotonic() + ACCEPT_PAUSE_MAX_S)
        else:
            self.start_accepting()

    def _take_one(self) -> bool:
        """Accept one pending connection, outside gevent's accept loop; whether one was."""
        if self.full():
            # gevent's own check (its pool of connection greenlets is full), which its
            # accept loop, started next, waits out; spawning now would block the hub.
            return False
        try:
            taken = super().do_read()
        except OSError:
            return False  # gevent's accept loop, started next, meets it again and backs off
        if taken:
            self.do_handle(*taken)
        return bool(taken)
