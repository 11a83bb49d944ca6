"""The embedded job queue: one SQLite file in WAL mode, shared by the processes of one machine.

Every change is one short transaction (``file`` has the file's rules),
and ``take`` selects and leases its jobs in a single ``BEGIN IMMEDIATE``
transaction, so two consumers can never lease the same job.

One column, ``due``, orders the work: a queued job's queueing time (first in,
first out), a running job's lease end (when it may be handed out again), NULL
once finished. ``take`` reads ``due <= now`` from one index, which covers new
jobs and expired leases alike.

Waiting in ``take`` polls every ``TAKE_POLL_S`` with a read that takes no
write lock, the cheap form of blocking SQLite allows (it has no cross-process
notification). Calls from gevent request greenlets are short transactions; a
writer in another process can hold them for its commit (``busy_timeout``
bounds it), which blocks the hub that long.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from serving_core import encoding
from serving_core.jobs.base import (
    MAX_STORED,
    Consumers,
    Job,
    KeyReused,
    QueueFull,
    lease_expired_error,
    new_job_id,
    params_digest,
)
from serving_core.jobs.sqlite.consumers import SqliteConsumers
from serving_core.jobs.sqlite.file import SqliteFile
from serving_core.jobs.sqlite.limits import Limits, admit
from serving_core.jobs.sqlite.rows import FINISH, LIVE, finish, finished_row, job_of, live
from serving_core.settings import Settings

TAKE_POLL_S = 0.01  # how often an idle take looks again: the latency it adds to a job


class SqliteJobQueue:
    """``JobQueue`` over ``settings.jobs_path``; ``serving_core.jobs.base`` has the guarantees."""

    def __init__(self, settings: Settings, queue: str, *, consumer: bool = False) -> None:
        self.queue = queue
        self.path = settings.jobs_path
        self.limits = Limits.of(settings)
        self.ttl_s = settings.jobs_ttl_s
        self.max_attempts = settings.jobs_max_attempts
        self.lease_s = settings.jobs_lease_s
        # A consumer's commits need not wait for the disk (file.py says why).
        self.file = SqliteFile(self.path, durable=not consumer)
        self._consumers = SqliteConsumers(self.file, queue, lease_s=self.lease_s, ttl_s=self.ttl_s)

    def submit(
        self,
        params: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        owner: str = "",
        traceparent: str | None = None,
    ) -> Job:
        now = time.time()
        traced = traceparent or ""
        try:
            job = self._submit(params, idempotency_key, owner, traced, now)
        except QueueFull as full:
            # At jobs_max_stored the expired rows go now, not at the next purge:
            # a place they free is taken at once.
            if full.setting != MAX_STORED or not self.file.purge(now, force=True):
                raise
            job = self._submit(params, idempotency_key, owner, traced, now)
        self.file.purge(now)
        return job

    def _submit(
        self,
        params: dict[str, Any],
        idempotency_key: str | None,
        owner: str,
        traceparent: str,
        now: float,
    ) -> Job:
        digest = params_digest(params)
        with self.file.transaction() as db:
            if idempotency_key is not None:
                row = db.execute(
                    "SELECT * FROM jobs WHERE queue = ? AND owner = ? AND idempotency_key = ?",
                    (self.queue, owner, idempotency_key),
                ).fetchone()
                if row is not None:
                    job = job_of(row)
                    if job.created_at + self.ttl_s > now and live(row, now):
                        if job.digest and job.digest != digest:
                            raise KeyReused(job)
                        return job
                    # The key outlived its window: free it for the new job.
                    db.execute("UPDATE jobs SET idempotency_key = NULL WHERE id = ?", (job.id,))
            admit(db, self.queue, owner, now, self.limits)
            job_id = new_job_id()
            db.execute(
                "INSERT INTO jobs (id, queue, status, params, created_at, idempotency_key, due,"
                " owner, digest, traceparent) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    self.queue,
                    encoding.dumps(params),
                    now,
                    idempotency_key,
                    now,
                    owner,
                    digest,
                    traceparent,
                ),
            )
            db.execute("UPDATE stored SET jobs = jobs + 1 WHERE queue = ?", (self.queue,))
        return Job.queued(
            job_id, self.queue, params, now, owner=owner, digest=digest, traceparent=traceparent
        )

    def get(self, job_id: str) -> Job | None:
        with self.file.reading() as db:
            row = db.execute(
                f"SELECT * FROM jobs WHERE id = :id AND queue = :queue AND {LIVE}",
                {"id": job_id, "queue": self.queue, "now": time.time()},
            ).fetchone()
        return None if row is None else job_of(row)

    def cancel(self, job_id: str) -> Job | None:
        now = time.time()
        with self.file.transaction() as db:
            db.execute(
                "UPDATE jobs SET status = 'cancelled', finished_at = :now, params = X'',"
                " expires_at = :now + :ttl, due = NULL"
                " WHERE id = :id AND queue = :queue AND status = 'queued'",
                {"id": job_id, "queue": self.queue, "now": now, "ttl": self.ttl_s},
            )
            row = db.execute(
                f"SELECT * FROM jobs WHERE id = :id AND queue = :queue AND {LIVE}",
                {"id": job_id, "queue": self.queue, "now": now},
            ).fetchone()
        return None if row is None else job_of(row)

    def take(self, consumer: str, max_items: int, wait_s: float) -> list[Job]:
        self._consumers.beat(consumer)
        deadline = time.monotonic() + wait_s
        while True:
            if self._anything_due():
                jobs = self._lease(consumer, max_items)
                if jobs:
                    return jobs
            if time.monotonic() >= deadline:
                return []
            # Outside the lock: a patched sleep yields to gevent; a plain one lets
            # other threads in.
            time.sleep(min(TAKE_POLL_S, max(0.0, deadline - time.monotonic())))

    def _anything_due(self) -> bool:
        with self.file.reading() as db:
            row = db.execute(
                "SELECT 1 FROM jobs WHERE queue = ? AND due <= ? LIMIT 1",
                (self.queue, time.time()),
            ).fetchone()
        return row is not None

    def _lease(self, consumer: str, max_items: int) -> list[Job]:
        now = time.time()
        lease = f"{consumer}:{new_job_id()}"
        taken: list[Job] = []
        with self.file.transaction() as db:
            while len(taken) < max_items:
                rows = db.execute(
                    "SELECT id, status, attempts FROM jobs WHERE queue = ? AND due <= ?"
                    " ORDER BY due LIMIT ?",
                    (self.queue, now, max_items - len(taken)),
                ).fetchall()
                if not rows:
                    break
                ids = []
                for job_id, status, attempts in rows:
                    if status == "running" and attempts >= self.max_attempts:
                        expired = lease_expired_error(attempts)
                        finish(db, job_id, "failed", now, self.ttl_s, error=expired)
                    else:
                        ids.append(job_id)
                if not ids:
                    continue
                # One statement for the batch, not one per job; RETURNING's order is
                # SQLite's, so the jobs are put back in the order they were due.
                leased = db.execute(
                    "UPDATE jobs SET status = 'running', attempts = attempts + 1,"
                    " started_at = ?, due = ?, lease = ?"
                    f" WHERE id IN ({', '.join('?' * len(ids))}) RETURNING *",
                    (now, now + self.lease_s, lease, *ids),
                ).fetchall()
                by_id = {row["id"]: row for row in leased}
                taken += [job_of(by_id[job_id]) for job_id in ids]
        return taken

    def complete(self, job: Job, result: Any) -> None:
        self.complete_many([(job, result)])

    def complete_many(self, finished: Sequence[tuple[Job, Any]]) -> None:
        if not finished:
            return
        now = time.time()
        with self.file.transaction() as db:
            # Any unfinished state, not only this lease: a slow consumer's result is as
            # good as the next one's, and the first stored wins. One statement for the
            # batch (``rows.finish``'s, with that condition), not a read and a write a job.
            db.executemany(
                f"{FINISH} AND queue = ? AND status IN ('queued', 'running')",
                [
                    (*finished_row("done", now, self.ttl_s, result=result), job.id, self.queue)
                    for job, result in finished
                ],
            )
        self.file.purge(now)

    def fail(self, job: Job, error: dict[str, Any], *, retry: bool = True) -> None:
        now = time.time()
        with self.file.transaction() as db:
            row = db.execute(
                "SELECT attempts FROM jobs WHERE id = ? AND queue = ?"
                " AND status = 'running' AND lease = ?",
                (job.id, self.queue, job.lease),
            ).fetchone()
            if row is None:
                return  # not this lease's to fail: finished, or handed to another consumer
            if not retry or row[0] >= self.max_attempts:
                finish(db, job.id, "failed", now, self.ttl_s, error=error)
            else:
                db.execute(
                    "UPDATE jobs SET status = 'queued', error = ?, started_at = NULL,"
                    " due = ?, lease = '' WHERE id = ?",
                    (encoding.dumps(error), now, job.id),
                )

    def release(self, jobs: Sequence[Job]) -> None:
        now = time.time()
        with self.file.transaction() as db:
            db.executemany(
                "UPDATE jobs SET status = 'queued', attempts = attempts - 1, started_at = NULL,"
                " due = ?, lease = '' WHERE id = ? AND queue = ? AND status = 'running'"
                " AND lease = ?",
                [(now, job.id, self.queue, job.lease) for job in jobs],
            )

    def renew(self, consumer: str, jobs: Sequence[Job]) -> int:
        if not jobs:
            return 0
        self._consumers.beat(consumer)
        due = time.time() + self.lease_s
        with self.file.transaction() as db:
            before = db.total_changes
            db.executemany(
                "UPDATE jobs SET due = ? WHERE id = ? AND queue = ? AND status = 'running'"
                " AND lease = ?",
                [(due, job.id, self.queue, job.lease) for job in jobs],
            )
            return db.total_changes - before

    def dead_letters(self, limit: int = 100) -> list[Job]:
        with self.file.reading() as db:
            rows = db.execute(
                f"SELECT * FROM jobs WHERE queue = :queue AND status = 'failed' AND {LIVE}"
                " ORDER BY finished_at DESC LIMIT :limit",
                {"queue": self.queue, "now": time.time(), "limit": limit},
            ).fetchall()
        return [job_of(row) for row in rows]

    def depth(self) -> int:
        with self.file.reading() as db:
            (count,) = db.execute(
                "SELECT count(*) FROM jobs WHERE queue = ? AND due IS NOT NULL", (self.queue,)
            ).fetchone()
        return int(count)

    def consumers(self, within_s: float) -> Consumers:
        return self._consumers.read(within_s)

    def close(self) -> None:
        self.file.close()
