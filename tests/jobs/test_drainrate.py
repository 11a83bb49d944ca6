"""A full queue's Retry-After: when a place frees, from how many jobs finished within the
last minute as the store records them. On both backends (SQLite, a real Redis).

A job finished in a test counts while it finished less than ``DRAIN_WINDOW_S`` (a
minute) before the refusal; one meant to be older is backdated in the store."""

from __future__ import annotations

import sqlite3

import pytest

from serving_core.jobs import drainrate
from serving_core.jobs.base import QUEUE_FULL_RETRY_AFTER_S, JobQueue, QueueFull
from serving_core.jobs.redis.queue import RedisJobQueue
from serving_core.jobs.sqlite.queue import SqliteJobQueue
from tests.jobs.conftest import MakeQueue

WINDOW_S = drainrate.DRAIN_WINDOW_S


def _finish(queue: JobQueue, count: int) -> list[str]:
    """``count`` jobs submitted, taken and done now, as a worker leaves them."""
    for n in range(count):
        queue.submit({"n": n})
    jobs = queue.take("w1", count, 0)
    assert len(jobs) == count
    queue.complete_many([(job, {"ok": True}) for job in jobs])
    return [job.id for job in jobs]


def _refused(queue: JobQueue) -> float:
    with pytest.raises(QueueFull) as full:
        queue.submit({"n": -1})
    assert full.value.setting == "SERVING_JOBS_MAX_QUEUE"
    return full.value.retry_after_s


def _finished_ago(queue: JobQueue, job_ids: list[str], seconds: float) -> None:
    """Move the jobs' finish (and so their expiry) ``seconds`` into the past, in the store."""
    if isinstance(queue, SqliteJobQueue):
        with sqlite3.connect(queue.path) as db:
            db.executemany(
                "UPDATE jobs SET finished_at = finished_at - ?, expires_at = expires_at - ?"
                " WHERE id = ?",
                [(seconds, seconds, job_id) for job_id in job_ids],
            )
        return
    assert isinstance(queue, RedisJobQueue)
    client = queue.redis.client
    for job_id in job_ids:
        client.zincrby(queue.finished, -seconds, job_id)
        client.hincrbyfloat(queue.prefix + "job:" + job_id, "finished_at", -seconds)


def test_a_full_queue_with_nothing_finished_lately_answers_the_fixed_retry_after(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue(jobs_max_queue=2)
    queue.submit({"n": 0})
    queue.submit({"n": 1})
    assert _refused(queue) == QUEUE_FULL_RETRY_AFTER_S


def test_the_faster_jobs_finish_the_sooner_a_refused_client_is_asked_back(
    make_queue: MakeQueue,
) -> None:
    roomy, full = make_queue(), make_queue(jobs_max_queue=2)
    _finish(roomy, 2)
    roomy.submit({"n": 0})
    roomy.submit({"n": 1})
    # Two jobs a minute: one place frees in 30 s.
    assert _refused(full) == pytest.approx(WINDOW_S / 2)
    _finish(roomy, 4)
    assert _refused(full) == pytest.approx(WINDOW_S / 6)


def test_done_failed_and_cancelled_jobs_all_count_as_drained(make_queue: MakeQueue) -> None:
    roomy, full = make_queue(), make_queue(jobs_max_queue=2)
    done, failed, cancelled = (roomy.submit({"n": n}) for n in range(3))
    roomy.cancel(cancelled.id)
    taken = {job.id: job for job in roomy.take("w1", 2, 0)}
    roomy.complete(taken[done.id], {"ok": True})
    roomy.fail(taken[failed.id], {"type": "invalid_input", "message": "no"}, retry=False)
    roomy.submit({"n": 3})
    roomy.submit({"n": 4})
    assert _refused(full) == pytest.approx(WINDOW_S / 3)


def test_jobs_finished_before_the_window_do_not_count(make_queue: MakeQueue) -> None:
    roomy, full = make_queue(), make_queue(jobs_max_queue=2)
    finished = _finish(roomy, 3)
    roomy.submit({"n": 0})
    roomy.submit({"n": 1})
    _finished_ago(roomy, finished[:2], WINDOW_S + 1)
    assert _refused(full) == pytest.approx(WINDOW_S / 1)
    _finished_ago(roomy, finished[2:], WINDOW_S + 1)
    assert _refused(full) == QUEUE_FULL_RETRY_AFTER_S  # none left to go by


def test_a_queue_over_a_lowered_cap_waits_for_the_excess_to_finish(
    make_queue: MakeQueue,
) -> None:
    roomy, full = make_queue(), make_queue(jobs_max_queue=2)
    _finish(roomy, 6)
    for n in range(4):
        roomy.submit({"n": n})
    # Three must finish before the fourth place is under the cap of two.
    assert _refused(full) == pytest.approx(3 * WINDOW_S / 6)


def test_the_estimate_is_clamped_between_a_second_and_a_minute(make_queue: MakeQueue) -> None:
    roomy, full = make_queue(), make_queue(jobs_max_queue=2)
    _finish(roomy, 1)
    for n in range(4):
        roomy.submit({"n": n})
    assert _refused(full) == drainrate.RETRY_AFTER_MAX_S  # 3 to finish at 1 a minute: 3 minutes
    _finish(roomy, 2 * int(3 * WINDOW_S))  # 6 a second: half a second for the three
    assert _refused(full) == QUEUE_FULL_RETRY_AFTER_S
