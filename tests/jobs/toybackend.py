"""A job queue backend for a test-only scheme, ``toy:///PATH``: what a new backend is (a
module with ``jobs.backends.Backend``'s names), over the SQLite queue at PATH."""

from __future__ import annotations

import dataclasses
from urllib.parse import urlsplit

from serving_core.jobs.base import JobQueue, StoreRefused
from serving_core.jobs.sqlite.queue import SqliteJobQueue
from serving_core.settings import Settings

SHARED = "SERVING_JOBS_URL"
REFUSED = "toy:///refused"  # a store its start-up check refuses


def check_url(url: str) -> None:
    if not urlsplit(url).path:
        raise ValueError(f"SERVING_JOBS_URL={url!r} names no file; use toy:///PATH")


def check_store(settings: Settings) -> None:
    if settings.jobs_url == REFUSED:
        raise StoreRefused(f"the toy store {REFUSED} drops jobs; use another path")


def open_queue(settings: Settings, queue: str, *, consumer: bool) -> JobQueue:
    path = urlsplit(settings.jobs_url).path
    return SqliteJobQueue(dataclasses.replace(settings, jobs_path=path), queue, consumer=consumer)
