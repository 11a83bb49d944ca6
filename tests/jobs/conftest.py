"""The job queues' fixtures: a queue on each backend (SQLite, and a real Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from serving_core.jobs.backends import open_queue
from serving_core.jobs.base import JobQueue
from serving_core.settings import Settings
from tests.redis_server import redis_server

MakeQueue = Callable[..., JobQueue]
POLL_TIMEOUT_S = 30.0  # a bound on waiting for an event, never an expected time


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.e2e)])
def make_queue(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[MakeQueue]:
    """Opens queues on one backend; every queue a test opens shares one queue name."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""
    name = f"test-{uuid.uuid4().hex[:8]}"  # tests share the module's Redis: one queue each
    opened: list[JobQueue] = []

    def make(**settings: Any) -> JobQueue:
        base = {"jobs_url": url, "jobs_path": str(tmp_path / "jobs.db")}
        queue = open_queue(Settings(**{**base, **settings}), name)
        opened.append(queue)
        return queue

    yield make
    for queue in opened:
        queue.close()
