"""How a server leaves on SIGTERM: readiness first, then the listener, then the work.

1. SIGTERM reaches the master (which forwards it to its workers at once) or
   every process: each worker's ``/readyz`` answers 503, and its answers close
   their connections (a keep-alive client reconnects, through a balancer that
   by then sends it elsewhere), while it keeps accepting for
   ``SERVING_DRAIN_S``. A balancer that still sends meanwhile gets answers,
   not refused connections.
2. Then each worker stops accepting (within a second: gunicorn's loop looks
   once a second) and finishes what it holds within
   ``SERVING_GRACEFUL_TIMEOUT_S``.
3. The master keeps its listeners, and a unix socket's path, until the drain
   is over. gunicorn closes them and unlinks the path as soon as it handles
   SIGTERM; the workers' inherited copies still accept, but a new
   connection to the unlinked path fails (nginx: a 502 for every request).

The drain is the app's, on SIGTERM, and not a preStop hook's: every
orchestrator (Kubernetes, Docker, systemd) sends SIGTERM, so the same
behaviour holds everywhere, and a hook that paused before SIGTERM would leave
``/readyz`` at 200 for the whole pause. The chart gives the app container no
preStop and lets nginx's preStop sleep ``serving.drainSeconds`` so that both
stop accepting together.

Signals around fork. A new worker installs gunicorn's handlers only after
``post_fork`` (setup_worker, the warm-up) and its loop's start-up; until then it
runs the master's handler, which puts a signal into the worker's copy of the
master's queue, where nothing reads it. A SIGTERM sent in that window (a test
stopping a server just after its workers said "ready", a pod deleted while a
worker is replaced) would be lost: the worker would serve on, and the master
wait its whole graceful timeout before killing it. So the master blocks TERM,
INT and QUIT while it forks; the worker unblocks them once its own handlers are
in place, and a signal sent meanwhile is handled then.
"""

from __future__ import annotations

import queue
import signal
import time
from collections.abc import Callable
from typing import Any

from gunicorn.arbiter import Arbiter
from gunicorn.workers.base import Worker

# Signals a worker must not meet before its own handlers are installed.
DEFERRED = {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT}


class DrainingArbiter(Arbiter):  # type: ignore[misc]
    """gunicorn's master, draining ``drain_s`` on SIGTERM before it closes its listeners."""

    def __init__(self, app: Any, drain_s: float, *, handed_over: bool = False) -> None:
        super().__init__(app)
        self.drain_s = drain_s
        self._terminated = False
        if handed_over:
            # The listener is ``serve --reload``'s, which the next server listens on:
            # gunicorn leaves a unix socket's path in place for systemd's sockets only.
            self.systemd = True

    def handle_term(self) -> None:
        self._terminated = True  # stop() drains only for SIGTERM, not on a halt
        super().handle_term()

    def spawn_worker(self) -> Any:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, DEFERRED)
        try:
            return super().spawn_worker()
        finally:
            # The master's own mask; in the worker this runs only as it exits.
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def stop(self, graceful: bool = True) -> None:
        if graceful and self._terminated and self.drain_s > 0 and self.WORKERS:
            graceful = self._drain()
        super().stop(graceful)

    def _drain(self) -> bool:
        """Tell the workers, keep the listeners open ``drain_s``; False on SIGINT/SIGQUIT."""
        self.log.info(
            "draining: /readyz answers 503, new connections are served for %g s "
            "(SERVING_DRAIN_S), then in-flight requests finish",
            self.drain_s,
        )
        self.kill_workers(signal.SIGTERM)
        ends = time.monotonic() + self.drain_s
        while self.WORKERS and (left := ends - time.monotonic()) > 0:
            try:
                sig = self.SIG_QUEUE.get(timeout=min(0.1, left))
            except queue.Empty:
                sig = None
            if sig in (signal.SIGINT, signal.SIGQUIT):
                self.log.info("quick shutdown requested during the drain")
                return False
            self.reap_workers()
        return True


class DrainingWorker(Worker):  # type: ignore[misc]
    """Put before gunicorn's worker class: SIGTERM starts a drain of ``drain_s``."""

    drain_s = 0.0  # post_fork sets SERVING_DRAIN_S
    on_drain: Callable[[], None] | None = None  # post_fork: the service's readiness turns 503
    _alive = True
    _drain_ends: float | None = None

    # gunicorn's loops read ``alive`` once a second and stop accepting when it is
    # False; during the drain it stays True until the drain is over.
    @property
    def alive(self) -> bool:
        ends = self._drain_ends
        return self._alive and (ends is None or time.monotonic() < ends)

    @alive.setter
    def alive(self, value: bool) -> None:
        self._alive = value

    @property
    def draining(self) -> bool:
        return self._drain_ends is not None

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Once: the master forwards SIGTERM too, and a signal to the whole
        # process group reaches a worker twice.
        if self._drain_ends is None:
            self._drain_ends = time.monotonic() + self.drain_s
            if self.on_drain is not None:
                self.on_drain()

    def init_signals(self) -> None:
        super().init_signals()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, DEFERRED)  # blocked since the fork
