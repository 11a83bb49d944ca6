"""Whose a job is, and how much a queue holds: owners, idempotency keys bound to their
parameters, finished jobs without parameters, the stored cap, the per-owner quota and
the SQLite purge. Each on both backends (SQLite, a real Redis) unless it is SQLite's own."""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

import pytest

from serving_core.jobs.backends import open_queue
from serving_core.jobs.base import MAX_STORED, KeyReused, QueueFull, QuotaExceeded
from serving_core.jobs.sqlite.file import PURGE_BATCH
from serving_core.settings import Settings
from tests.jobs.conftest import POLL_TIMEOUT_S, MakeQueue
from tests.servers import wait_for

ALICE, BOB = "a" * 32, "b" * 32  # callers' identities, as web.guard.caller_of makes them


def test_an_idempotency_key_is_its_owners_and_bound_to_its_parameters(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    first = queue.submit({"n": 1, "m": 2}, idempotency_key="invoice-1001", owner=ALICE)
    assert first.owner == ALICE
    # The same body, its keys in another order: the same request, the same job.
    again = queue.submit({"m": 2, "n": 1}, idempotency_key="invoice-1001", owner=ALICE)
    assert again.id == first.id
    with pytest.raises(KeyReused):
        queue.submit({"n": 2}, idempotency_key="invoice-1001", owner=ALICE)
    # Bob's key of the same name is his own: a job of his, never Alice's.
    bobs = queue.submit({"n": 2}, idempotency_key="invoice-1001", owner=BOB)
    assert bobs.id != first.id
    assert bobs.owner == BOB
    assert queue.get(first.id).owner == ALICE  # type: ignore[union-attr]
    assert queue.get(bobs.id).params == {"n": 2}  # type: ignore[union-attr]


def test_a_finished_job_keeps_its_outcome_and_drops_its_parameters(make_queue: MakeQueue) -> None:
    queue = make_queue(jobs_max_attempts=1)
    done, failed, cancelled = (queue.submit({"text": "x" * 1000, "n": n}) for n in range(3))
    queue.cancel(cancelled.id)
    taken = {job.id: job for job in queue.take("w1", 2, 0)}
    queue.complete(taken[done.id], {"label": "ok"})
    queue.fail(taken[failed.id], {"type": "model_error", "message": "no"})
    for job_id, status in [(done.id, "done"), (failed.id, "failed"), (cancelled.id, "cancelled")]:
        stored = queue.get(job_id)
        assert stored is not None
        assert (stored.status, stored.params) == (status, {})
    assert queue.get(done.id).result == {"label": "ok"}  # type: ignore[union-attr]


def test_past_max_stored_submit_is_refused_until_finished_jobs_expire(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue(jobs_max_stored=2, jobs_ttl_s=0.5)
    for n in range(2):
        queue.submit({"n": n})
    for job in queue.take("w1", 2, 0):
        queue.complete(job, {"ok": True})
    with pytest.raises(QueueFull) as full:
        queue.submit({"n": 2})
    assert full.value.setting == MAX_STORED
    assert 0 < full.value.retry_after_s <= 1.0  # the oldest expires within the TTL

    def accepted() -> bool:
        try:
            queue.submit({"n": 3})
        except QueueFull:
            return False
        return True

    wait_for(accepted, "a place freed by the expired jobs", POLL_TIMEOUT_S)


def test_an_owner_past_its_quota_is_refused_and_others_are_not(make_queue: MakeQueue) -> None:
    queue = make_queue(jobs_max_per_caller=2)
    alices = [queue.submit({"n": n}, owner=ALICE) for n in range(2)]
    with pytest.raises(QuotaExceeded) as refused:
        queue.submit({"n": 2}, owner=ALICE)
    assert refused.value.retry_after_s > 0
    assert "SERVING_JOBS_MAX_PER_CALLER=2" in str(refused.value)
    queue.submit({"n": 0}, owner=BOB)  # Bob's count is his own
    queue.submit({"n": 0})  # and a job without an owner (no API keys) has no quota
    queue.cancel(alices[0].id)  # a finished job no longer counts
    queue.submit({"n": 3}, owner=ALICE)
    with pytest.raises(QuotaExceeded):
        queue.submit({"n": 4}, owner=ALICE)


def _expired_rows(path: str, queue: str, count: int) -> None:
    """``count`` finished jobs whose TTL ran out an hour ago, as a busy day leaves them."""
    past = time.time() - 3600
    with sqlite3.connect(path) as db:
        db.executemany(
            "INSERT INTO jobs (id, queue, status, params, created_at, finished_at, expires_at,"
            " result) VALUES (?, ?, 'done', X'', ?, ?, ?, ?)",
            [(uuid.uuid4().hex, queue, past, past, past, b"x" * 500) for _ in range(count)],
        )
        db.execute("UPDATE stored SET jobs = jobs + ? WHERE queue = ?", (count, queue))


def _file(path: str, query: str) -> Any:
    with sqlite3.connect(path) as db:
        return db.execute(query).fetchone()[0]


def test_the_sqlite_purge_deletes_every_expired_row_at_once_and_shrinks_the_file(
    tmp_path: Any,
) -> None:
    path = str(tmp_path / "jobs.db")
    settings = Settings(jobs_path=path, jobs_max_stored=10_000)
    first = open_queue(settings, "q")
    first.submit({"n": 0})
    first.close()
    expired = 3 * PURGE_BATCH + 1
    _expired_rows(path, "q", expired)
    pages = _file(path, "PRAGMA page_count")
    queue = open_queue(settings, "q")  # a new handle purges on its first write
    try:
        queue.submit({"n": 1})
    finally:
        queue.close()
    assert _file(path, "SELECT count(*) FROM jobs") == 2
    assert _file(path, "SELECT jobs FROM stored WHERE queue = 'q'") == 2
    assert _file(path, "PRAGMA freelist_count") == 0
    assert _file(path, "PRAGMA page_count") < pages / 10


def test_a_full_sqlite_queue_purges_at_once_when_its_jobs_have_expired(tmp_path: Any) -> None:
    path = str(tmp_path / "jobs.db")
    settings = Settings(jobs_path=path, jobs_max_stored=5)
    queue = open_queue(settings, "q")
    try:
        queue.submit({"n": 0})  # the handle's periodic purge ran here, on nothing
        _expired_rows(path, "q", 4)
        queue.submit({"n": 1})  # at the cap: the expired rows go, this one is taken
        assert _file(path, "SELECT count(*) FROM jobs") == 2
    finally:
        queue.close()


# The schema serving-core made before jobs had owners (2026-11) or traceparents
# (2026-12): its files must open.
OLD_SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, queue TEXT NOT NULL, status TEXT NOT NULL, params BLOB NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, started_at REAL,
    finished_at REAL, result BLOB, error BLOB, idempotency_key TEXT,
    lease TEXT NOT NULL DEFAULT '', due REAL, expires_at REAL
);
CREATE UNIQUE INDEX jobs_key ON jobs (queue, idempotency_key) WHERE idempotency_key IS NOT NULL;
INSERT INTO jobs (id, queue, status, params, created_at, idempotency_key, due)
    VALUES ('0123456789abcdef0123456789abcdef', 'q', 'queued', '{"n":1}', 1e10, 'k', 1e10);
"""


def test_a_sqlite_file_from_before_owners_opens_with_its_jobs(tmp_path: Any) -> None:
    path = str(tmp_path / "jobs.db")
    with sqlite3.connect(path) as db:
        db.executescript(OLD_SCHEMA)
    queue = open_queue(Settings(jobs_path=path, jobs_max_stored=2), "q")
    try:
        old = queue.get("0123456789abcdef0123456789abcdef")
        assert old is not None
        assert (old.params, old.owner, old.traceparent) == ({"n": 1}, "", "")
        assert queue.submit({"n": 1}, idempotency_key="k").id == old.id
        queue.submit({"n": 2})
        with pytest.raises(QueueFull):  # the old job counts among those held
            queue.submit({"n": 3})
    finally:
        queue.close()
