"""A job consumer's batch (``JobLoop.run_batch``) over a real ``Engine`` and a real SQLite
queue: what is stored, what is retried, what runs again alone (the whole ``serving-core
worker`` is in tests/process/test_jobmaster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving_core import Handler, InvalidInput
from serving_core.engine.engine import Engine
from serving_core.jobs.backends import open_queue
from serving_core.jobs.base import JobQueue
from serving_core.loops.jobs import JobLoop
from serving_core.settings import Settings


class Poisoned(Handler):
    """Fails every batch that holds a ``poison`` item; refuses ``invalid`` ones."""

    name = "poisoned"

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def predict_batch(self, items: list[Any]) -> list[Any]:
        self.batches.append([item["n"] for item in items])
        if any(item.get("poison") for item in items):
            raise RuntimeError("poisoned")
        return [
            InvalidInput("refused") if item.get("invalid") else {"double": 2 * item["n"]}
            for item in items
        ]


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[JobQueue]:
    queue = open_queue(Settings(jobs_path=str(tmp_path / "jobs.db")), "poisoned")
    yield queue
    queue.close()


def run_one_batch(handler: Handler, queue: JobQueue, params: list[dict[str, Any]]) -> list[str]:
    ids = [queue.submit(p).id for p in params]
    loop = JobLoop(Engine(handler, max_batch_size=8), queue, "c", 8, stopping=lambda: True)
    jobs = queue.take("c", 8, 0.0)
    assert [job.id for job in jobs] == ids
    loop.run_batch(jobs)
    return ids


def status(queue: JobQueue, job_id: str) -> tuple[str, int]:
    job = queue.get(job_id)
    assert job is not None
    return job.status, job.attempts


def test_a_model_failure_runs_each_job_again_alone_once_and_its_batch_mates_are_done(
    queue: JobQueue,
) -> None:
    handler = Poisoned()
    first, poison, last = run_one_batch(
        handler, queue, [{"n": 1}, {"n": 2, "poison": True}, {"n": 3}]
    )
    # Alone once: the poison job's further attempts are the queue's retries.
    assert handler.batches == [[1, 2, 3], [1], [2], [3]]
    assert status(queue, first) == status(queue, last) == ("done", 1)
    assert status(queue, poison) == ("queued", 1)
    job = queue.get(poison)
    assert job is not None
    assert job.error is not None
    assert job.error["type"] == "model_error"
    done = queue.get(first)
    assert done is not None
    assert done.result == {"double": 2}


def test_a_lone_model_failure_is_not_run_again(queue: JobQueue) -> None:
    handler = Poisoned()
    [poison] = run_one_batch(handler, queue, [{"n": 2, "poison": True}])
    assert handler.batches == [[2]]
    assert status(queue, poison) == ("queued", 1)


def test_a_handlers_refusal_fails_its_job_for_good_and_runs_nothing_again(
    queue: JobQueue,
) -> None:
    handler = Poisoned()
    refused, fine = run_one_batch(handler, queue, [{"n": 1, "invalid": True}, {"n": 2}])
    assert handler.batches == [[1, 2]]
    assert status(queue, refused) == ("failed", 1)
    assert status(queue, fine) == ("done", 1)
