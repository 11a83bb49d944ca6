"""How a worker leaves so that gunicorn's master forks a fresh one from its preloaded model.

- On a watchdog verdict (``watchdog.Verdict``) the worker stops taking
  connections (gunicorn's ``alive`` flag, which its loop reads every second).
  A graceful verdict (a memory ceiling, ``SystemExit`` from the handler)
  finishes what the worker holds, as ``max_requests`` does. An urgent one (a
  hung or dead model thread) has failed the queue already: the worker lets
  those answers go out, then exits at once, since its model thread may never
  return and idle keep-alive connections would hold a graceful exit open.
- A respawned worker whose warm-up fails exits alone. gunicorn's master halts
  the whole server when a worker exits with its boot-error code (3), which
  is what an exception out of ``post_fork`` gives: right for the first
  workers (a handler that breaks its contract stops ``serve``), wrong for a
  replacement, which may only have met a loaded machine. A replacement waits
  1 s, 2 s, 4 s, then every 10 s (doubling with each consecutive failed
  warm-up of any worker; a warm-up that succeeds starts the count again),
  and exits with code 1; the master then forks another. The other workers
  keep serving meanwhile.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import threading
from typing import Any

from serving_core.engine.watchdog import Verdict

log = logging.getLogger("serving_core.process.recycle")

# How long a worker whose model hung keeps running after failing its queue: the
# failed requests' 503s are written within milliseconds (each with Connection:
# close), and within a second gunicorn's loop has closed its listener.
URGENT_EXIT_AFTER_S = 1.5
URGENT_EXIT_CODE = 1
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 10.0  # below gunicorn's heartbeat timeout (30 s or more)


def leave(worker: Any, verdict: Verdict) -> None:
    """The watchdog's ``on_verdict`` (on its thread): end this worker."""
    if verdict.urgent:
        log.error(
            "worker %s: %s; its queued requests failed (503) and it exits now; "
            "gunicorn forks a new worker from the preloaded master",
            worker.pid,
            verdict.reason,
        )
    else:
        log.warning(
            "worker %s: %s; it finishes its requests and exits, and gunicorn forks a "
            "new worker from the preloaded master",
            worker.pid,
            verdict.reason,
        )
    worker.alive = False
    if verdict.urgent:
        threading.Event().wait(URGENT_EXIT_AFTER_S)  # a native wait: gevent patches time.sleep
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(URGENT_EXIT_CODE)


class WarmUpFailures:
    """Consecutive failed warm-ups of respawned workers, in memory the master shares
    with the workers it forks (each failed worker is a new process)."""

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, ctypes.sizeof(ctypes.c_int))
        self._count: Any = ctypes.c_int.from_buffer(self._memory)

    def failed(self) -> int:
        self._count.value += 1
        return int(self._count.value)

    def succeeded(self) -> None:
        self._count.value = 0


def retry_in_s(failures: int) -> float:
    return float(min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** max(0, failures - 1)))


def warm_up_failed(worker: Any, failures: WarmUpFailures, exc: BaseException) -> None:
    """``post_fork`` of a respawned worker whose start failed: wait, then exit alone."""
    wait_s = retry_in_s(failures.failed())
    log.error(
        "worker %s: its start-up (setup_worker or the warm-up) failed: %r; it exits in "
        "%g s and gunicorn forks another, while the other workers keep serving",
        worker.pid,
        exc,
        wait_s,
        exc_info=exc,
    )
    worker.notify()  # gunicorn's heartbeat: the master must not count the wait as a hang
    threading.Event().wait(wait_s)
    sys.exit(1)  # not 3: gunicorn halts on a boot error
