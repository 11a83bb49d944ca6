"""The SQLite job queue's file: its schema, its connections (WAL), and its rows as ``Job``s."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

from serving_core import encoding
from serving_core.jobs.base import Job, JobStatus, QueueUnavailable

BUSY_TIMEOUT_S = 30.0  # how long a call waits for another process's write
WAL_RETRY_S = 0.005  # how often an opening connection asks for WAL mode again

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    status TEXT NOT NULL,
    params BLOB NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    result BLOB,
    error BLOB,
    idempotency_key TEXT,
    lease TEXT NOT NULL DEFAULT '',
    due REAL,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (queue, due) WHERE due IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (queue, finished_at) WHERE status = 'failed';
CREATE UNIQUE INDEX IF NOT EXISTS jobs_key ON jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS consumers (
    queue TEXT NOT NULL,
    consumer TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (queue, consumer)
);
"""


@contextmanager
def translated(path: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as error:
        raise QueueUnavailable(f"the job queue's SQLite file {path}: {error}") from error


def connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every write above opens
    # its own BEGIN IMMEDIATE, which takes the write lock up front instead of
    # failing with SQLITE_BUSY on upgrade from a read.
    db = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    db.row_factory = sqlite3.Row
    use_wal(db)
    db.execute("PRAGMA synchronous = FULL")
    db.executescript(SCHEMA)
    return db


def use_wal(db: sqlite3.Connection) -> None:
    """Switch ``db`` to WAL, waiting up to ``BUSY_TIMEOUT_S`` for another process.

    Changing the journal mode takes an exclusive lock for which SQLite does not
    call the busy handler: when a server's workers opened a new file at once,
    one failed at once with "database is locked" (half of 300 tries with
    three processes), and gunicorn stopped the server ("Worker failed to
    boot"). So this retries; once the file is in WAL mode it stays so, and the
    statement no longer needs that lock.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_S)


def live(row: sqlite3.Row, now: float) -> bool:
    return row["expires_at"] is None or row["expires_at"] > now


def job_of(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        queue=row["queue"],
        status=cast(JobStatus, row["status"]),
        params=encoding.loads(row["params"]),
        attempts=row["attempts"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=None if row["result"] is None else encoding.loads(row["result"]),
        error=None if row["error"] is None else encoding.loads(row["error"]),
        lease=row["lease"],
    )
