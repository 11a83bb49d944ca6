"""The SQLite queue's ``jobs`` rows: which a reader may see, how one reads as a ``Job``,
and how one is finished.
"""

from __future__ import annotations

import sqlite3
from typing import Any, cast

from serving_core import encoding
from serving_core.jobs.base import Job, JobStatus

# A row a reader may see: not finished, or finished within jobs_ttl_s.
LIVE = "(expires_at IS NULL OR expires_at > :now)"


def live(row: sqlite3.Row, now: float) -> bool:
    return row["expires_at"] is None or row["expires_at"] > now


def job_of(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        queue=row["queue"],
        status=cast(JobStatus, row["status"]),
        params=encoding.loads(row["params"]) if row["params"] else {},
        attempts=row["attempts"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=None if row["result"] is None else encoding.loads(row["result"]),
        error=None if row["error"] is None else encoding.loads(row["error"]),
        lease=row["lease"],
        owner=row["owner"],
        digest=row["digest"],
        traceparent=row["traceparent"],
    )


# A job ended: its parameters go, its outcome stays readable until ``expires_at``.
FINISH = (
    "UPDATE jobs SET status = ?, result = ?, error = coalesce(?, error), params = X'',"
    " finished_at = ?, expires_at = ?, due = NULL, lease = '' WHERE id = ?"
)


def finished_row(
    status: JobStatus,
    now: float,
    ttl_s: float,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """``FINISH``'s values but the id."""
    return (
        status,
        None if status != "done" else encoding.dumps(result),
        None if error is None else encoding.dumps(error),
        now,
        now + ttl_s,
    )


def finish(
    db: sqlite3.Connection,
    job_id: str,
    status: JobStatus,
    now: float,
    ttl_s: float,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
) -> None:
    """End the job ``status``, readable for ``ttl_s``; an error keeps the last one if None.
    Its parameters go: a finished job keeps only its outcome (and their digest)."""
    db.execute(FINISH, (*finished_row(status, now, ttl_s, result=result, error=error), job_id))
