"""A job consumer's lease renewer (``loops.leases``) over a real SQLite queue."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from serving_core.jobs.backends import open_queue
from serving_core.loops.leases import LeaseRenewer
from serving_core.settings import Settings
from tests.servers import wait_for

LEASE_S = 1.0


def test_a_batch_is_renewed_while_it_runs_and_no_longer_once_it_ends(tmp_path: Path) -> None:
    settings = Settings(jobs_path=str(tmp_path / "jobs.db"), jobs_lease_s=LEASE_S)
    queue, other = open_queue(settings, "lease"), open_queue(settings, "lease")
    renewer = LeaseRenewer(queue, "slow", LEASE_S)
    try:
        job = queue.submit({"n": 1})
        jobs = queue.take("slow", 1, 0)
        with renewer.renewing(jobs):
            held_until = time.monotonic() + 2.5 * LEASE_S  # past two leases
            while time.monotonic() < held_until:
                assert other.take("thief", 1, 0.2) == []
        # Once the batch is over its lease runs out, and another consumer gets it.
        [again] = wait_for(lambda: other.take("thief", 1, 0.2), "the lease to run out")
        assert again.id == job.id
    finally:
        renewer.close()
        queue.close()
        other.close()


def test_one_thread_serves_every_batch_and_close_ends_it(tmp_path: Path) -> None:
    settings = Settings(jobs_path=str(tmp_path / "jobs.db"), jobs_lease_s=LEASE_S)
    queue = open_queue(settings, "lease")
    renewer = LeaseRenewer(queue, "c", LEASE_S)
    try:
        before = threading.active_count()
        for n in range(3):
            queue.submit({"n": n})
            with renewer.renewing(queue.take("c", 1, 0)):
                pass
        assert threading.active_count() == before + 1
        assert [t.name for t in threading.enumerate()].count("serving-lease-renewer") == 1
    finally:
        renewer.close()
        queue.close()
    assert "serving-lease-renewer" not in [t.name for t in threading.enumerate()]
