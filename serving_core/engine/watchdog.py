"""Watches one worker from a thread of its own: its model thread and its memory.

The model thread can stop serving without the worker noticing: a handler
that blocks with the GIL released (a lock, a socket, a wedged GPU call)
leaves the event loop, gunicorn's heartbeat and ``/healthz`` healthy while
every request times out; a model thread that died leaves every request a
503. Nothing inside the worker can unstick it, but the master can fork a
fresh one from its preloaded copy of the model. So a watchdog thread looks
every ``interval_s`` and, when the worker should go, hands a ``Verdict`` to
``on_verdict`` (the server's hook: the worker leaves, gunicorn replaces it):

- urgent: the running batch (a generating handler's step) is ``hang_margin_s``
  past the last deadline of its requests, or the model thread (the decoder's)
  has died. Its queued requests are failed at
  once (503, retry: another worker can serve them) and new ones are refused.
- graceful: the handler raised ``SystemExit``, or the process's resident
  memory passed ``max_rss_bytes`` (a leak). The worker finishes what it holds.

Imports no Flask and no gunicorn.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from serving_core.engine.modelthread import Clock

log = logging.getLogger("serving_core.engine.watchdog")

INTERVAL_S = 0.2


class Watched(Protocol):
    """What the watchdog asks of a worker's model thread: the batcher's, or a
    generating handler's decoder."""

    def stalled(self, now: float, margin_s: float) -> str | None:
        """Why it can no longer serve, or None."""
        ...

    def abandon(self, reason: str) -> None:
        """Give up on it: fail what it holds now and refuse the rest."""
        ...

    @property
    def recycle(self) -> str | None:
        """Why the worker must go once it has finished what it holds, or None."""
        ...


@dataclass(frozen=True)
class Verdict:
    """Why this worker should be replaced, and whether its queue was given up."""

    reason: str
    urgent: bool


class Watchdog:
    def __init__(
        self,
        batcher: Watched | None,
        *,
        hang_margin_s: float,
        max_rss_bytes: int,
        on_verdict: Callable[[Verdict], None],
        interval_s: float = INTERVAL_S,
        clock: Clock = time.monotonic,
        rss: Callable[[], int | None] | None = None,
    ) -> None:
        self._batcher = batcher
        self._hang_margin_s = hang_margin_s
        self._max_rss_bytes = max_rss_bytes
        self._on_verdict = on_verdict
        self._interval_s = interval_s
        self._clock = clock
        self._rss = rss or resident_bytes
        self._stop = threading.Event()  # threading is never monkey-patched here
        self._thread = threading.Thread(target=self._loop, name="serving-watchdog", daemon=True)
        self.verdict: Verdict | None = None

    def start(self) -> None:
        if self._max_rss_bytes and self._rss() is None:
            log.warning(
                "SERVING_MAX_RSS_BYTES is set, but this system does not report a process's "
                "resident memory (/proc/self/statm): the memory ceiling is off"
            )
            self._max_rss_bytes = 0
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> Verdict | None:
        """One look; a verdict is final (the queue of a hung model is already failed)."""
        batcher = self._batcher
        if batcher is not None:
            stalled = batcher.stalled(self._clock(), self._hang_margin_s)
            if stalled is not None:
                batcher.abandon(stalled)
                return Verdict(stalled, urgent=True)
            if batcher.recycle is not None:
                return Verdict(batcher.recycle, urgent=False)
        if self._max_rss_bytes:
            rss = self._rss()
            if rss is not None and rss > self._max_rss_bytes:
                return Verdict(
                    f"its resident memory ({rss / 2**20:.0f} MiB) passed SERVING_MAX_RSS_BYTES "
                    f"({self._max_rss_bytes / 2**20:.0f} MiB)",
                    urgent=False,
                )
        return None

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                verdict = self.check()
            except Exception:
                log.exception("the watchdog failed to check this worker")
                continue
            if verdict is not None:
                self.verdict = verdict
                self._on_verdict(verdict)
                return


def resident_bytes() -> int | None:
    """This process's resident set size (Linux), or None where it is not reported."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
