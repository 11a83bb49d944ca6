"""Fair accepting: gevent workers share new connections out between them.

A busy hub loops back to its listener faster than an idle worker wakes up, so
a burst of new connections could all land on one worker (8 of 8 in one of 12
bursts measured), and with keep-alive they stay there, halving the service.
Workers count their open connections in memory shared with the master; one
that would hold more than an equal share plus one stops accepting, letting the
others take what is pending, until it is back within its share or
``ACCEPT_PAUSE_MAX_S`` has passed (a stuck or restarting sibling never stalls
it longer).

The master calls ``share_connections`` before the first fork and
``worker_exited`` for each dead worker; a worker takes its slot with
``claim_slot`` (in the master, as gunicorn creates it) and accepts through
``FairServer``.
"""

from __future__ import annotations

import ctypes
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

    def over_share(self, slot: int) -> bool:
        """Whether ``slot`` holds more than an equal share plus one."""
        counts = self.counts
        return bool(counts[slot] > sum(counts) / len(counts) + 1)


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
    """gevent's stream server, pausing accepts while its worker holds more than its share."""

    slot: int | None = None
    # This worker's open client connections, over all its listeners; also the
    # adaptive batcher's bound on who may still send.
    open_connections = 0
    connections: Connections | None = None  # set in the worker, after fork
    paused = False  # over its share: the rest of the backlog is left to the siblings

    def do_read(self) -> Any:
        # gevent's accept loop takes up to ``max_accept`` (100) connections per
        # wake-up, and goes on after ``stop_accepting``: a burst that reached the
        # backlog before this hub woke would all land here. None ends that loop.
        if self.paused:
            return None
        return super().do_read()

    def do_handle(self, *args: Any) -> None:
        # Counted here, at accept, not when the connection's greenlet first runs:
        # several accepts can come before any of those greenlets does.
        self._count(+1)
        if FairServer.connections is not None:
            FairServer.connections.make_room(FairServer.open_connections)
        super().do_handle(*args)
        if self._over_share():
            self.paused = True
            self.stop_accepting()
            self._pause(time.monotonic() + ACCEPT_PAUSE_MAX_S)

    def do_close(self, *args: Any) -> None:
        try:
            super().do_close(*args)
        finally:
            self._count(-1)

    def _count(self, change: int) -> None:
        FairServer.open_connections += change
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
            self.paused = False
            return
        if self._over_share() and time.monotonic() < until:
            self._pause(until)  # still ahead: leave what is pending to the others a while longer
        else:
            self.paused = False
            self.start_accepting()
