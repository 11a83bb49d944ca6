"""The SQLite queue's limits, checked in the submit's own transaction: unfinished jobs
(``jobs_max_queue``), every job held (``jobs_max_stored``) and one owner's unfinished
ones (``jobs_max_per_caller``).

The jobs held are counted in the ``stored`` table (one row per queue: a submit
adds one, the purge takes off what it deletes), so the check costs one lookup,
not a count over up to a million rows. Expired rows not yet purged still count:
the cap bounds the file, and a submit that finds it full purges first
(``SqliteJobQueue.submit``).

A submit refused at ``jobs_max_queue`` is told when a place should free up,
from the jobs finished within the last minute (``jobs.drainrate``): a count on the
expiry index, run only then, in the same transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from serving_core.jobs import drainrate
from serving_core.jobs.base import MAX_STORED, QueueFull, QuotaExceeded, quota_message
from serving_core.settings import Settings


@dataclass(frozen=True)
class Limits:
    max_queue: int
    max_stored: int
    max_per_caller: int  # 0: none
    ttl_s: float  # a finished job's expiry is its finish plus this: what drain counts by

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            settings.jobs_max_queue,
            settings.jobs_max_stored,
            settings.jobs_max_per_caller,
            settings.jobs_ttl_s,
        )


def admit(db: sqlite3.Connection, queue: str, owner: str, now: float, limits: Limits) -> None:
    """Raise QueueFull or QuotaExceeded if one more job of ``owner`` would pass a limit."""
    (depth,) = db.execute(
        "SELECT count(*) FROM jobs WHERE queue = ? AND due IS NOT NULL", (queue,)
    ).fetchone()
    if depth >= limits.max_queue:
        raise QueueFull(
            f"the {queue!r} job queue holds {depth} unfinished jobs "
            f"(SERVING_JOBS_MAX_QUEUE={limits.max_queue}); retry later",
            retry_after_s=drain_retry_after(db, queue, depth - limits.max_queue + 1, now, limits),
        )
    held = stored(db, queue)
    if held >= limits.max_stored:
        (oldest,) = db.execute(
            "SELECT min(expires_at) FROM jobs WHERE queue = ? AND expires_at IS NOT NULL",
            (queue,),
        ).fetchone()
        raise QueueFull(
            f"the {queue!r} job queue holds {held} jobs "
            f"({MAX_STORED}={limits.max_stored}); retry later",
            retry_after_s=drainrate.store_full_retry_after(oldest, now),
            setting=MAX_STORED,
        )
    if limits.max_per_caller and owner:
        (mine,) = db.execute(
            "SELECT count(*) FROM jobs WHERE queue = ? AND owner = ? AND due IS NOT NULL",
            (queue, owner),
        ).fetchone()
        if mine >= limits.max_per_caller:
            raise QuotaExceeded(quota_message(mine, limits.max_per_caller))


def drain_retry_after(
    db: sqlite3.Connection, queue: str, needed: int, now: float, limits: Limits
) -> float:
    """``drainrate.queue_full_retry_after`` from the jobs finished within the window, counted
    on ``jobs_queue_expiry`` and no further than the count that can change the answer."""
    (finished,) = db.execute(
        "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE queue = ? AND expires_at > ? LIMIT ?)",
        (
            queue,
            drainrate.expired_after(now, limits.ttl_s),
            drainrate.count_limit(needed, limits.ttl_s),
        ),
    ).fetchone()
    return drainrate.queue_full_retry_after(needed, int(finished), limits.ttl_s)


def stored(db: sqlite3.Connection, queue: str) -> int:
    """Rows of ``queue``, expired ones not yet purged included: what the file holds."""
    row = db.execute("SELECT jobs FROM stored WHERE queue = ?", (queue,)).fetchone()
    if row is not None:
        return int(row[0])
    # A file whose tables predate the count, or a new queue: count once.
    (count,) = db.execute("SELECT count(*) FROM jobs WHERE queue = ?", (queue,)).fetchone()
    db.execute("INSERT INTO stored (queue, jobs) VALUES (?, ?)", (queue, count))
    return int(count)
