"""Torch's intra-op threads: around fork, and lent between forked processes while idle.

One multi-threaded torch operation before fork leaves GNU OpenMP's thread
pool unusable in the forked children: a child then hangs on its first
parallel operation on its main thread. So the master keeps torch at one
thread (no pool exists at fork), and each child takes its share of the
usable cores after fork. ``serve``, ``batch`` and ``worker`` all do this.
Touches torch only when the handler imported it.

Lending: with W workers on C cores each has C // W torch threads, so a lone
request runs on one core while the others sit idle, though torch would run it
sooner on more (docs/serving.md, "Workers and threads"). ``CoreLending``
keeps, in memory shared by the master and its forks, which processes are idle
and since when; before each batch a process adds the shares of the peers idle
for ``LEND_AFTER_S`` to its own. Under load nobody is idle that long, so every
process keeps its share and no core is oversubscribed; a peer that wakes while
its cores are lent runs beside the borrower for the rest of that one batch. Our
own, since torch and OpenMP only know one process's threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

from serving_core.cores import usable_cores
from serving_core.settings import Settings

# How long a peer must have been idle before its cores are borrowed: longer than
# the gap between two batches under load (a hand-off, a queue's write), so that
# a busy peer is never mistaken for an idle one; far shorter than a lone
# client's pause between requests.
LEND_AFTER_S = 0.02


def limit_master_threads() -> None:
    """Keep torch (if the handler uses it) single-threaded in the master, before fork."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def set_worker_threads(workers: int) -> int | None:
    """Give each forked process its share of the usable cores for torch's intra-op pool,
    and its place among the processes that lend them; the share, or None where the
    handler does not use torch."""
    join_lending()
    return set_model_threads(max(1, usable_cores() // workers))


def set_model_threads(threads: int) -> int | None:
    """Set torch's intra-op threads in this (forked) process, if the handler uses torch;
    ``threads``, or None where it does not (nothing was set)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    torch.set_num_threads(threads)
    return threads


def model_threads() -> int | None:
    """This thread's torch intra-op threads, or None where the handler does not use
    torch: what a thread started to run the model takes (``set_model_threads``)."""
    torch = sys.modules.get("torch")
    return None if torch is None else int(torch.get_num_threads())


class CoreLending:
    """Which of the forked processes are idle, and since when, in shared memory.

    Made in the master before fork. A forked process claims a slot as it starts
    (``join``; a lock on the shared memory's file orders the claims, and a dead
    owner's slot is taken over), marks itself busy around each batch, and sets torch's
    threads, on the thread that runs the model, to its share plus the shares of
    its idle peers, at most every usable core.
    """

    def __init__(self, processes: int, share: int, cores: int) -> None:
        self.share = share
        self.cores = cores
        # The most a batch runs on, every peer idle (``_lent``): what the log says.
        self.most = min(share * processes, cores)
        # Twice the processes: a recycled worker's successor can start before it leaves.
        slots = 2 * processes
        # A memfd, not /dev/shm: the chart's root filesystem is read-only, and a
        # POSIX record lock on it is let go when its holder dies, even by SIGKILL.
        self._fd = _shared_file()
        os.ftruncate(self._fd, slots * 16)
        self._memory = mmap.mmap(self._fd, slots * 16)
        self._owners = (ctypes.c_int64 * slots).from_buffer(self._memory)
        # 0.0 while busy, else when (CLOCK_MONOTONIC, one clock for every process) it idled.
        self._idle_since = (ctypes.c_double * slots).from_buffer(self._memory, slots * 8)
        self._slot = -1
        # The process that holds ``_slot``: a fork starts without one. The master
        # never claims one: it would count as an idle peer forever.
        self._pid = os.getpid()
        # What keeps this process busy now: requests in hand (``busy``), a batch, a
        # consumer's batch around its engine calls; from several threads (a lock).
        self._depth = 0
        self._lock = threading.Lock()
        # What each thread has set: OpenMP's thread count belongs to the calling thread.
        self._set_here = threading.local()

    def join(self) -> None:
        """In a forked process, at its start: its slot, idle, so that its peers can
        borrow its cores before its first batch."""
        if self._pid != os.getpid():
            self._claim()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Busy for the block (a request in hand, from any thread); torch untouched."""
        self._enter()
        try:
            yield
        finally:
            self._leave()

    @contextlib.contextmanager
    def hold(self) -> Iterator[int]:
        """Busy for the block, on the thread that runs the model: yields the torch
        threads it runs with, its share and its idle peers'."""
        self._enter()
        try:
            # The master (whose torch must stay at one thread until fork), or a
            # process that found no free slot, leaves its threads as they are.
            yield self._set(self._lent()) if self._slot >= 0 else self.share
        finally:
            self._leave()

    def _enter(self) -> None:
        self.join()
        with self._lock:
            self._depth += 1
            if self._depth == 1 and self._slot >= 0:
                self._idle_since[self._slot] = 0.0

    def _leave(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._slot >= 0:
                self._idle_since[self._slot] = time.monotonic()

    def _lent(self) -> int:
        now, threads = time.monotonic(), self.share
        for slot, owner in enumerate(self._owners):
            since = self._idle_since[slot]
            if owner and slot != self._slot and since and now - since >= LEND_AFTER_S:
                threads += self.share
        return min(threads, self.cores)

    def _set(self, threads: int) -> int:
        # Only a change costs: torch.set_num_threads resizes OpenMP's team.
        if getattr(self._set_here, "threads", 0) != threads:
            self._set_here.threads = threads
            set_model_threads(threads)
        return threads

    def _claim(self) -> None:
        pid = os.getpid()
        self._pid, self._slot, self._depth = pid, -1, 0
        self._lock = threading.Lock()  # the master's could have been held at fork
        self._set_here = threading.local()
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            for slot, owner in enumerate(self._owners):
                if owner == 0 or not _alive(owner):
                    self._idle_since[slot] = time.monotonic()
                    self._owners[slot] = pid
                    self._slot = slot
                    return
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_lending: CoreLending | None = None


def lend_idle_cores(processes: int, cores: int | None = None) -> None:
    """In the master, before the first fork: let ``processes`` forked processes lend
    each other their share of ``cores`` (the usable cores) while idle."""
    global _lending  # noqa: PLW0603 - one master per process
    cores = usable_cores() if cores is None else cores
    share = max(1, cores // processes)
    _lending = CoreLending(processes, share, cores) if processes > 1 and share < cores else None


def share_idle_cores(settings: Settings, processes: int, cores: int | None = None) -> None:
    """``lend_idle_cores`` unless SERVING_LEND_CORES is off: then each keeps its share."""
    global _lending  # noqa: PLW0603 - one master per process
    if settings.lend_cores:
        lend_idle_cores(processes, cores)
    else:
        _lending = None


def join_lending() -> None:
    """In each forked process, at its start (``CoreLending.join``), when lending is on."""
    if _lending is not None:
        _lending.join()


def most_threads() -> int | None:
    """The most torch threads a forked process's batch may run on, its share and its
    idle peers' (every usable core at most); None when nothing is lent (lending
    off, one process, or a shared model process)."""
    return _lending.most if _lending is not None else None


def busy() -> contextlib.AbstractContextManager[None]:
    """Around a request's stay in a worker: while any is in hand, the worker lends
    nothing, even between its batches (its hub parses and answers meanwhile)."""
    return _lending.busy() if _lending is not None else contextlib.nullcontext()


def held() -> contextlib.AbstractContextManager[object]:
    """Around a batch (or a consumer's whole batch): busy, and the lent cores in use."""
    return _lending.hold() if _lending is not None else contextlib.nullcontext()


def _shared_file() -> int:
    """An anonymous file for memory the forks share: a memfd on Linux; where there is
    none (macOS), a temporary file unlinked at once, which locks and maps the same."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("serving-core-cores", os.MFD_CLOEXEC)
    descriptor, path = tempfile.mkstemp(prefix="serving-core-cores-")
    os.unlink(path)
    return descriptor
