"""A job consumer's lease renewals: one thread for the consumer's life.

SERVING_JOBS_LEASE_S: a batch running longer than a third of it has its jobs'
leases renewed every third of it, so a slow model is not mistaken for a dead
consumer (its jobs handed out again, and failed once their attempts ran out).
The thread is the consumer's, not the batch's: a thread started and joined per
batch would cost every batch, for a renewal that almost no batch needs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence

from serving_core.jobs.base import Job, JobQueue

log = logging.getLogger("serving_core.loops.leases")


class LeaseRenewer:
    """``renewing(jobs)`` around a batch: its leases are renewed while it runs."""

    def __init__(self, queue: JobQueue, consumer: str, lease_s: float) -> None:
        self._queue = queue
        self._consumer = consumer
        self.every_s = lease_s / 3
        self._changed = threading.Condition()
        self._jobs: Sequence[Job] = ()
        self._due = 0.0  # monotonic: the running batch's next renewal
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def renewing(self, jobs: Sequence[Job]) -> Iterator[None]:
        with self._changed:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="serving-lease-renewer", daemon=True
                )
                self._thread.start()
            self._jobs, self._due = jobs, time.monotonic() + self.every_s
            self._changed.notify()
        try:
            yield
        finally:
            # Waits for a renewal in progress: none runs once the batch is stored.
            with self._changed:
                self._jobs = ()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        with self._changed:
            while not self._closed:
                left = self._due - time.monotonic()
                if not self._jobs or left > 0:
                    self._changed.wait(left if self._jobs else None)
                    continue
                self._due += self.every_s
                try:
                    # Under the lock, so the batch's end waits for it (above).
                    self._queue.renew(self._consumer, self._jobs)
                except Exception:  # the queue is down: the next renewal may get through
                    log.warning(
                        "could not renew the leases of %d jobs", len(self._jobs), exc_info=True
                    )
