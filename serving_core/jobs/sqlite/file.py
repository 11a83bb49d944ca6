"""The SQLite job queue's file: its connections (WAL), and ``SqliteFile``, the handle the
queue and its consumers' heartbeats share (``schema`` has the tables).

WAL lets readers (``get``, ``depth``) run while one writer commits.
``synchronous=FULL``: a job is on disk when ``submit`` returns, since the queue
must lose nothing it accepted (NORMAL would survive a killed process but not a
power cut). Its cost is an fsync of the WAL at every commit: each submit waits
for the disk. A worker's consumers commit with NORMAL (``durable=False``):
their takes and results survive a killed process, and a power cut can only
undo some of them, which hands those jobs out again when their leases run out
(at-least-once, as for a killed consumer). Two fsyncs a batch would leave a
consumer's core idle for a large share of its batch.

The file is private: made mode 0600 before SQLite opens it (its ``-wal`` and
``-shm`` files take the database's mode), and the default directory
(``settings.private``) is made 0700 and refused if another user owns it, since
``/tmp`` lets anyone create a name first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from serving_core.jobs.base import QueueUnavailable
from serving_core.jobs.sqlite.schema import AUTO_VACUUM, prepare
from serving_core.settings.private import private_directory

log = logging.getLogger("serving_core.jobs.sqlite.file")

BUSY_TIMEOUT_S = 30.0  # how long a call waits for another process's write
WAL_RETRY_S = 0.005  # how often an opening connection asks for WAL mode again
PURGE_EVERY_S = 60.0  # how often a handle deletes expired rows
PURGE_BATCH = 1000  # rows per purge transaction, so none holds the write lock long
VACUUM_PAGES = 2048  # pages handed back to the file system per step (8 MiB at 4 KiB)


@contextmanager
def translated(path: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as error:
        # The path is for the operator's log; the client reads only the exception's
        # message (a 503's), which must not tell it how the server is laid out.
        log.warning("the job queue's SQLite file %s failed: %s", path, error)
        raise QueueUnavailable("the job queue's store did not answer") from error


def create_private(path: str) -> None:
    """Make ``path`` mode 0600 if it is new, in a 0700 directory if that is the default one."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.basename(directory) == os.path.basename(private_directory()):
        _own_directory(directory)
    # Made before SQLite opens it, which would make it 0644 (less the umask).
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))


def _own_directory(directory: str) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise QueueUnavailable(
            f"the job queue's directory {directory} is not a directory of this user "
            f"(uid {os.getuid()}): another user may have made it to read the jobs; "
            "remove it, or set SERVING_JOBS_PATH to a file in a directory of your own"
        )
    if found.st_mode & 0o077:
        os.chmod(directory, 0o700)  # ours, made before this rule: close it


def connect(path: str, *, durable: bool = True) -> sqlite3.Connection:
    # isolation_level=None: no implicit transactions; every write above opens
    # its own BEGIN IMMEDIATE, which takes the write lock up front instead of
    # failing with SQLITE_BUSY on upgrade from a read.
    db = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    db.row_factory = sqlite3.Row
    db.execute(AUTO_VACUUM)
    use_wal(db)
    db.execute(f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}")
    prepare(db)
    return db


def use_wal(db: sqlite3.Connection) -> None:
    """Switch ``db`` to WAL, waiting up to ``BUSY_TIMEOUT_S`` for another process.

    Changing the journal mode takes an exclusive lock for which SQLite does not
    call the busy handler: when a server's workers open a new file at once, one
    can fail at once with "database is locked", and gunicorn stops the server
    ("Worker failed to boot"). So this retries; once the file is in WAL mode it
    stays so, and from then on the statement does not need that lock.
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

    def __init__(self, path: str, *, durable: bool = True) -> None:
        self.path = path
        self.durable = durable  # FULL, or NORMAL for a consumer's commits (above)
        # A native lock, held only around SQLite calls, which never yield to
        # gevent: it serialises threads sharing this object, never greenlets.
        self._lock = threading.Lock()
        self._pid = -1
        self._db: sqlite3.Connection | None = None
        self._next_purge = 0.0
        try:
            create_private(path)
        except OSError as error:
            raise QueueUnavailable(f"the job queue's SQLite file {path}: {error}") from error
        with self.transaction():
            pass  # connect now, so a bad path fails at start-up

    def _connection(self) -> sqlite3.Connection:
        # A connection must not cross fork (SQLite's rule): a process that
        # inherited this object opens its own, leaving the parent's alone.
        if self._db is None or self._pid != os.getpid():
            self._db = connect(self.path, durable=self.durable)
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

    def purge(self, now: float, *, force: bool = False) -> int:
        """Delete every expired row, at most every ``PURGE_EVERY_S`` (or now, ``force``),
        then hand the freed pages back; returns how many rows went.

        Expired rows are invisible already (LIVE); deleting them bounds the file
        (and frees their places under ``jobs_max_stored``). It runs until none is
        left, however many expired since the last time, in transactions of
        ``PURGE_BATCH`` rows: between two, the write lock is free for submits and
        takes, and ``time.sleep(0)`` lets a gevent worker's other requests run.
        """
        if not force and now < self._next_purge:
            return 0
        self._next_purge = now + PURGE_EVERY_S
        purged = 0
        while True:
            with self.transaction() as db:
                gone = db.execute(
                    "DELETE FROM jobs WHERE id IN"
                    " (SELECT id FROM jobs WHERE expires_at <= ? LIMIT ?) RETURNING queue",
                    (now, PURGE_BATCH),
                ).fetchall()
                per_queue = Counter(queue for (queue,) in gone)
                db.executemany(
                    "UPDATE stored SET jobs = max(0, jobs - ?) WHERE queue = ?",
                    [(count, queue) for queue, count in per_queue.items()],
                )
            purged += len(gone)
            if len(gone) < PURGE_BATCH:
                break
            time.sleep(0)
        if purged:
            self._vacuum()
        return purged

    def _vacuum(self) -> None:
        # executescript steps the pragma to its end; execute would free one page. A
        # file made without auto_vacuum frees nothing (schema): stop then too.
        before: int | None = None
        while True:
            with self.reading() as db:
                db.executescript(f"PRAGMA incremental_vacuum({VACUUM_PAGES})")
                (free,) = db.execute("PRAGMA freelist_count").fetchone()
            if not free or (before is not None and free >= before):
                return
            before = free
            time.sleep(0)

    def close(self) -> None:
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None
