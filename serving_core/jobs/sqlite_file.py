"""The SQLite job queue's file: its schema, its connections (WAL), and ``SqliteFile``, the
handle the queue and its consumers' heartbeats share.

WAL lets readers (``get``, ``depth``) run while one writer commits.
``synchronous=FULL``: a job is on disk when ``submit`` returns, since the queue
must lose nothing it accepted (NORMAL would survive a killed process but not a
power cut).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from serving_core.jobs.base import QueueUnavailable

log = logging.getLogger("serving_core.jobs.sqlite_file")

BUSY_TIMEOUT_S = 30.0  # how long a call waits for another process's write
WAL_RETRY_S = 0.005  # how often an opening connection asks for WAL mode again
PURGE_EVERY_S = 60.0  # how often a handle deletes expired rows
PURGE_BATCH = 1000  # rows per purge, so a purge never holds the write lock long

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
        # The path is for the operator's log; the client reads only the exception's
        # message (a 503's), which must not tell it how the server is laid out.
        log.warning("the job queue's SQLite file %s failed: %s", path, error)
        raise QueueUnavailable("the job queue's store did not answer") from error


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


class SqliteFile:
    """One process's connection to the file, behind a lock, opened again after fork."""

    def __init__(self, path: str) -> None:
        self.path = path
        # A native lock, held only around SQLite calls, which never yield to
        # gevent: it serialises threads sharing this object, never greenlets.
        self._lock = threading.Lock()
        self._pid = -1
        self._db: sqlite3.Connection | None = None
        self._next_purge = 0.0
        with self.transaction():
            pass  # connect now, so a bad path fails at start-up

    def _connection(self) -> sqlite3.Connection:
        # A connection must not cross fork (SQLite's rule): a process that
        # inherited this object opens its own, leaving the parent's alone.
        if self._db is None or self._pid != os.getpid():
            self._db = connect(self.path)
            self._pid = os.getpid()
        return self._db

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock, translated(self.path):
            yield self._connection()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.reading() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def purge(self, now: float) -> None:
        """Delete some expired rows, at most every ``PURGE_EVERY_S``.

        Expired rows are invisible already (LIVE); deleting them only bounds the
        file, so it runs now and then, in small batches, from whoever writes.
        """
        if now < self._next_purge:
            return
        self._next_purge = now + PURGE_EVERY_S
        with self.transaction() as db:
            db.execute(
                "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE expires_at <= ? LIMIT ?)",
                (now, PURGE_BATCH),
            )

    def close(self) -> None:
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None
