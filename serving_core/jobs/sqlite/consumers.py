"""The SQLite queue's consumers: each one's heartbeat, a row per (queue, consumer)."""

from __future__ import annotations

import time

from serving_core.jobs.base import Consumers, Heartbeat
from serving_core.jobs.sqlite.file import SqliteFile


class SqliteConsumers:
    """Who takes from ``queue``: ``beat`` records a consumer, ``read`` counts the live ones."""

    def __init__(self, file: SqliteFile, queue: str, *, lease_s: float, ttl_s: float) -> None:
        self.file = file
        self.queue = queue
        self.ttl_s = ttl_s
        self._heartbeat = Heartbeat(lease_s)

    def beat(self, consumer: str) -> None:
        now = time.time()
        if not self._heartbeat.due(consumer, now):
            return
        with self.file.transaction() as db:
            db.execute(
                "INSERT INTO consumers (queue, consumer, seen_at) VALUES (?, ?, ?)"
                " ON CONFLICT (queue, consumer) DO UPDATE SET seen_at = excluded.seen_at",
                (self.queue, consumer, now),
            )
            # Consumer names are host-pid: each restart adds one, so forget old ones.
            db.execute(
                "DELETE FROM consumers WHERE queue = ? AND seen_at < ?",
                (self.queue, now - self.ttl_s),
            )

    def read(self, within_s: float) -> Consumers:
        with self.file.reading() as db:
            live, last = db.execute(
                "SELECT coalesce(sum(seen_at >= ?), 0), max(seen_at) FROM consumers"
                " WHERE queue = ?",
                (time.time() - within_s, self.queue),
            ).fetchone()
        return Consumers(int(live), last)
