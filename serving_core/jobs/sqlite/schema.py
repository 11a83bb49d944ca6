"""The SQLite job queue's schema, and the steps that bring an older file up to it.

``prepare`` runs on every new connection: each statement is idempotent, and
the one change that is not (adding a column) checks and alters inside one
``BEGIN IMMEDIATE``, so processes opening an older file at once add it once.

``auto_vacuum = INCREMENTAL`` is set before the first table exists (SQLite
reads it only then): the purge then hands freed pages back to the file system
in bounded steps (``PRAGMA incremental_vacuum(N)``). A full ``VACUUM`` is the
other choice and is worse for a live queue: it rewrites the whole file under
an exclusive lock (every submit and take waits) and needs the file's size
again in free disk. A file whose tables were made without the setting keeps
``auto_vacuum = NONE``: its freed pages are reused by new rows, so it stays at
its high-water mark; ``sqlite3 FILE 'PRAGMA auto_vacuum = INCREMENTAL; VACUUM'``
(with the queue stopped) converts it.
"""

from __future__ import annotations

import sqlite3

# Before anything writes the file's first page (WAL mode does): SQLite takes it
# only then, and afterwards only through a VACUUM.
AUTO_VACUUM = "PRAGMA auto_vacuum = INCREMENTAL"

TABLES = """
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
    expires_at REAL,
    owner TEXT NOT NULL DEFAULT '',
    digest TEXT NOT NULL DEFAULT '',
    traceparent TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS consumers (
    queue TEXT NOT NULL,
    consumer TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (queue, consumer)
);
CREATE TABLE IF NOT EXISTS stored (
    queue TEXT PRIMARY KEY,
    jobs INTEGER NOT NULL
);
"""

# Columns added since the first schema: (name, definition).
ADDED = (
    ("owner", "TEXT NOT NULL DEFAULT ''"),
    ("digest", "TEXT NOT NULL DEFAULT ''"),
    ("traceparent", "TEXT NOT NULL DEFAULT ''"),  # an older file's jobs: untraced
)

INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (queue, due) WHERE due IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_queue_expiry ON jobs (queue, expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (queue, finished_at) WHERE status = 'failed';
CREATE INDEX IF NOT EXISTS jobs_owner_due ON jobs (queue, owner) WHERE due IS NOT NULL;
DROP INDEX IF EXISTS jobs_key;
CREATE UNIQUE INDEX IF NOT EXISTS jobs_owner_key ON jobs (queue, owner, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""


def prepare(db: sqlite3.Connection) -> None:
    """Bring the file ``db`` opened up to the schema (``db`` in autocommit mode)."""
    db.executescript(TABLES)
    if _missing(db):
        db.execute("BEGIN IMMEDIATE")
        try:
            for name, definition in _missing(db):
                db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {definition}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    db.executescript(INDEXES)


def _missing(db: sqlite3.Connection) -> list[tuple[str, str]]:
    have = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    return [(name, definition) for name, definition in ADDED if name not in have]
