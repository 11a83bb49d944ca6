"""The job queue's guarantees, each proved on both backends: SQLite and a real Redis."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest

from serving_core.jobs.backends import open_queue
from serving_core.jobs.base import Job, JobQueue, QueueFull
from serving_core.settings import Settings
from tests.jobs.conftest import POLL_TIMEOUT_S, MakeQueue
from tests.servers import wait_for

FORK = multiprocessing.get_context("fork")


def take_all(queue: JobQueue, ids: set[str], consumer: str = "rescuer") -> list[Job]:
    """Take until every job in ``ids`` came back (their leases may have to expire first)."""
    taken: list[Job] = []
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while {job.id for job in taken} < ids:
        assert time.monotonic() < deadline, f"never handed out again: {ids - {j.id for j in taken}}"
        taken += queue.take(consumer, len(ids), 0.05)
    return taken


def test_a_job_goes_from_submit_to_take_to_done_with_its_result(make_queue: MakeQueue) -> None:
    queue = make_queue()
    job = queue.submit({"text": "hi"})
    assert len(job.id) >= 32
    assert job.id.isalnum()
    assert queue.get(job.id) == job
    [taken] = queue.take("w1", 10, 0)
    assert (taken.id, taken.status, taken.params, taken.attempts) == (
        job.id,
        "running",
        {"text": "hi"},
        1,
    )
    assert taken.started_at is not None
    queue.complete(taken, {"label": "greeting", "scores": [0.5, 1.0]})
    done = queue.get(job.id)
    assert done is not None
    assert done.status == "done"
    assert done.result == {"label": "greeting", "scores": [0.5, 1.0]}
    public = done.public()
    assert public["status"] == "done"
    assert public["result"] == done.result
    assert public["attempts"] == 1
    assert public["created_at"].endswith("+00:00")
    assert public["finished_at"] is not None
    assert "error" not in public
    assert "params" not in public


def test_a_job_keeps_its_submitters_traceparent_for_its_runs(make_queue: MakeQueue) -> None:
    queue = make_queue()
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced, untraced = queue.submit({"n": 1}, traceparent=parent), queue.submit({"n": 2})
    assert (traced.traceparent, untraced.traceparent) == (parent, "")
    taken = {job.id: job for job in queue.take("w1", 2, 0)}
    assert taken[traced.id].traceparent == parent
    assert taken[untraced.id].traceparent == ""
    queue.complete(taken[traced.id], {"ok": True})
    done = queue.get(traced.id)
    assert done is not None
    assert done.traceparent == parent


def test_an_unknown_job_is_none(make_queue: MakeQueue) -> None:
    queue = make_queue()
    assert queue.get(uuid.uuid4().hex) is None
    assert queue.cancel(uuid.uuid4().hex) is None


def test_take_returns_at_most_max_items_in_submission_order(make_queue: MakeQueue) -> None:
    queue = make_queue()
    ids = [queue.submit({"n": n}).id for n in range(5)]
    batches = [[job.id for job in queue.take("w1", 2, 0)] for _ in range(4)]
    assert batches == [ids[0:2], ids[2:4], ids[4:5], []]


def test_a_waiting_take_wakes_when_a_job_arrives(make_queue: MakeQueue) -> None:
    queue, submitter = make_queue(), make_queue()
    got: list[Job] = []
    taker = threading.Thread(target=lambda: got.extend(queue.take("w1", 4, POLL_TIMEOUT_S)))
    taker.start()
    job = submitter.submit({"n": 1})
    taker.join()
    assert [j.id for j in got] == [job.id]


def _open_at(path: str, start_at: float) -> None:
    from serving_core.jobs.sqlite.queue import SqliteJobQueue

    while time.time() < start_at:
        pass  # spin: the processes must open the file within microseconds of each other
    queue = SqliteJobQueue(Settings(jobs_path=path), "boot")
    queue.submit({"n": os.getpid()})  # opened by the constructor; and written to
    queue.close()


def test_processes_that_open_a_new_sqlite_file_at_once_all_succeed(tmp_path: Any) -> None:
    # A server's workers open the job queue's file at boot, at the same moment.
    # Switching a new file to WAL used to fail at once in one of them ("database is
    # locked"), about every other time with three processes, and stopped the server.
    for attempt in range(20):
        path = str(tmp_path / f"jobs-{attempt}.db")
        start_at = time.time() + 0.05
        openers = [FORK.Process(target=_open_at, args=(path, start_at)) for _ in range(3)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(60)
        assert [opener.exitcode for opener in openers] == [0, 0, 0], f"attempt {attempt}"


def _drain(make: MakeQueue, consumer: str, conn: Any, start: Any) -> None:
    queue = make()  # opened after fork: each process has its own connection
    taken: list[str] = []
    start.wait()  # both take from the first job on
    while True:
        jobs = queue.take(consumer, 16, 0.05)
        if not jobs and queue.depth() == 0:
            break
        if jobs:
            # The model's run, when a consumer holds no lock. (Without it, SQLite's
            # busy handler, which backs off, lets one consumer that commits back to
            # back take every job: correct, but it would not test two takers.)
            time.sleep(0.002)
        for job in jobs:
            queue.complete(job, {"by": consumer, "n": job.params["n"]})
            taken.append(job.id)
    conn.send(taken)
    conn.close()


def test_two_consumer_processes_never_take_the_same_job(make_queue: MakeQueue) -> None:
    queue = make_queue()
    ids = {queue.submit({"n": n}).id for n in range(1000)}
    pipes, workers = [], []
    start = FORK.Barrier(2)
    for consumer in ("a", "b"):
        receive, send = FORK.Pipe(duplex=False)
        worker = FORK.Process(target=_drain, args=(make_queue, consumer, send, start))
        worker.start()
        send.close()
        pipes.append(receive)
        workers.append(worker)
    taken = [receive.recv() for receive in pipes]
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    assert len(taken[0]) + len(taken[1]) == 1000
    assert set(taken[0]) | set(taken[1]) == ids
    assert taken[0], "b took every job: no concurrency was tested"
    assert taken[1], "a took every job: no concurrency was tested"
    for job_id in ids:
        job = queue.get(job_id)
        assert job is not None
        assert job.status == "done"
        assert job.attempts == 1


def _take_and_hang(make: MakeQueue, conn: Any, settings: dict[str, Any]) -> None:
    queue = make(**settings)  # the taker's settings decide its lease
    conn.send([job.id for job in queue.take("doomed", 10, POLL_TIMEOUT_S)])
    conn.close()
    signal.pause()  # holds its leases until killed


def test_jobs_held_by_a_killed_consumer_are_handed_out_again_after_the_lease(
    make_queue: MakeQueue,
) -> None:
    settings = {"jobs_lease_s": 0.3}
    queue = make_queue(**settings)
    numbers = {queue.submit({"n": n}).id: n for n in range(10)}
    ids = set(numbers)
    receive, send = FORK.Pipe(duplex=False)
    doomed = FORK.Process(target=_take_and_hang, args=(make_queue, send, settings))
    doomed.start()
    send.close()
    assert set(receive.recv()) == ids
    os.kill(doomed.pid, signal.SIGKILL)  # type: ignore[arg-type]
    doomed.join()
    assert queue.depth() == 10  # leased, not lost
    for job in take_all(queue, ids):
        queue.complete(job, {"n": job.params["n"]})
    for job_id in ids:
        job = queue.get(job_id)
        assert job is not None
        assert job.status == "done"
        assert job.attempts == 2
        assert job.result == {"n": numbers[job_id]}
    assert queue.depth() == 0


def test_a_batch_completed_at_once_stores_each_result_and_skips_finished_ones(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    ids = [queue.submit({"n": n}).id for n in range(5)]
    taken = queue.take("w1", 5, 0)
    assert [job.id for job in taken] == ids
    cancelled = queue.submit({"n": 99})
    assert queue.cancel(cancelled.id) is not None
    queue.complete(taken[0], {"first": True})  # already done: its first result stays
    late = queue.get(cancelled.id)
    assert late is not None
    queue.complete_many([(job, {"n": job.params["n"]}) for job in taken] + [(late, {"n": 99})])
    queue.complete_many([])
    stored = [queue.get(job_id) for job_id in ids]
    assert [(j.status, j.result) for j in stored if j is not None] == [
        ("done", {"first": True}),
        *(("done", {"n": n}) for n in range(1, 5)),
    ]
    never = queue.get(cancelled.id)
    assert never is not None
    assert (never.status, never.result) == ("cancelled", None)
    assert queue.depth() == 0


def test_a_renewed_lease_keeps_a_long_running_job_from_being_handed_out_again(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue(jobs_lease_s=1.0)
    other = make_queue(jobs_lease_s=1.0)
    job = queue.submit({"n": 1})
    [taken] = queue.take("slow", 1, 0)
    renewed_until = time.monotonic() + 2.5  # past two leases
    while time.monotonic() < renewed_until:
        assert queue.renew("slow", [taken]) == 1
        assert other.take("thief", 1, 0) == []
        time.sleep(0.1)
    # Renewals stop: the lease runs out, and the job is handed out again.
    [again] = take_all(other, {job.id}, "thief")
    assert again.attempts == 2
    assert queue.renew("slow", [taken]) == 0  # no longer its lease
    assert queue.renew("slow", []) == 0


def test_a_job_completed_twice_keeps_the_first_result(make_queue: MakeQueue) -> None:
    queue = make_queue(jobs_lease_s=0.2)
    job = queue.submit({"n": 1})
    [slow] = queue.take("slow", 1, 0)
    [fast] = take_all(queue, {job.id}, "fast")  # slow's lease ran out
    queue.complete(fast, {"by": "fast"})
    queue.complete(slow, {"by": "slow"})
    stored = queue.get(job.id)
    assert stored is not None
    assert stored.status == "done"
    assert stored.result == {"by": "fast"}


def test_a_consumer_whose_lease_expired_cannot_fail_or_release_the_job(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue(jobs_lease_s=0.2)
    job = queue.submit({"n": 1})
    [stale] = queue.take("slow", 1, 0)
    [current] = take_all(queue, {job.id}, "fast")
    queue.fail(stale, {"type": "model_error", "message": "late"})
    queue.release([stale])
    after = queue.get(job.id)
    assert after is not None
    assert (after.status, after.attempts) == ("running", 2)
    assert after.lease == current.lease
    queue.complete(current, {"ok": True})
    assert queue.get(job.id).status == "done"  # type: ignore[union-attr]


def test_a_job_that_always_fails_is_a_dead_letter_after_max_attempts(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue(jobs_max_attempts=3)
    job = queue.submit({"n": 1})
    for attempt in (1, 2, 3):
        [taken] = queue.take("w1", 1, 0)
        assert taken.attempts == attempt
        queue.fail(taken, {"type": "model_error", "message": f"attempt {attempt}"})
        status = queue.get(job.id).status  # type: ignore[union-attr]
        assert status == ("failed" if attempt == 3 else "queued")
    assert queue.take("w1", 1, 0) == []
    failed = queue.get(job.id)
    assert failed is not None
    assert failed.attempts == 3
    assert failed.error == {"type": "model_error", "message": "attempt 3"}
    assert failed.public()["error"] == failed.error
    assert [dead.id for dead in queue.dead_letters()] == [job.id]
    assert queue.depth() == 0


def test_a_failure_without_retry_fails_the_job_at_once(make_queue: MakeQueue) -> None:
    queue = make_queue(jobs_max_attempts=3)
    job = queue.submit({"n": "not a number"})
    [taken] = queue.take("w1", 1, 0)
    queue.fail(taken, {"type": "invalid_input", "message": "n: not a number"}, retry=False)
    failed = queue.get(job.id)
    assert failed is not None
    assert (failed.status, failed.attempts) == ("failed", 1)
    assert [dead.id for dead in queue.dead_letters()] == [job.id]


def test_a_job_whose_last_lease_expires_is_failed_not_handed_out_again(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue(jobs_max_attempts=1, jobs_lease_s=0.2)
    job = queue.submit({"n": 1})
    queue.take("crashes-on-it", 1, 0)

    def failed() -> bool:
        assert queue.take("w2", 1, 0) == []
        return queue.get(job.id).status == "failed"  # type: ignore[union-attr]

    wait_for(failed, "the expired last attempt to fail the job", timeout_s=POLL_TIMEOUT_S)
    dead = queue.get(job.id)
    assert dead is not None
    assert dead.error is not None
    assert dead.error["type"] == "lease_expired"
    assert [d.id for d in queue.dead_letters()] == [job.id]


def test_a_take_fails_an_expired_last_attempt_and_leases_the_rest_of_its_batch_in_order(
    make_queue: MakeQueue,
) -> None:
    # SQLite leases a batch in one statement: the job it fails instead is left out of
    # it, and the others come back in the order they were due, each under the lease.
    queue = make_queue(jobs_max_attempts=1, jobs_lease_s=0.2)
    crashed = queue.submit({"n": 0})
    [held] = queue.take("crashes-on-it", 1, 0)
    ids = [queue.submit({"n": n}).id for n in range(1, 4)]
    assert held.started_at is not None
    wait_for(
        lambda: time.time() > held.started_at + 0.2,  # type: ignore[operator]
        "the crashed consumer's lease to run out",
        timeout_s=POLL_TIMEOUT_S,
    )
    taken = queue.take("w2", 10, 0)
    assert [job.id for job in taken] == ids
    assert {(job.status, job.attempts) for job in taken} == {("running", 1)}
    assert len({job.lease for job in taken}) == 1
    dead = queue.get(crashed.id)
    assert dead is not None
    assert dead.error is not None
    assert (dead.status, dead.error["type"]) == ("failed", "lease_expired")


def test_the_same_idempotency_key_returns_the_same_job(make_queue: MakeQueue) -> None:
    queue = make_queue()
    first = queue.submit({"n": 1}, idempotency_key="order-17")
    again = queue.submit({"n": 1}, idempotency_key="order-17")
    other = queue.submit({"n": 1}, idempotency_key="order-18")
    assert again.id == first.id
    assert other.id != first.id
    assert queue.depth() == 2


def test_an_idempotency_key_outlives_neither_its_window_nor_its_job(make_queue: MakeQueue) -> None:
    queue = make_queue(jobs_ttl_s=0.2)
    first = queue.submit({"n": 1}, idempotency_key="k")
    [taken] = queue.take("w1", 1, 0)
    queue.complete(taken, {"ok": True})
    wait_for(
        lambda: queue.get(first.id) is None, "the finished job to expire", timeout_s=POLL_TIMEOUT_S
    )
    assert queue.submit({"n": 1}, idempotency_key="k").id != first.id


def test_a_job_cancelled_while_queued_is_never_taken(make_queue: MakeQueue) -> None:
    queue = make_queue()
    doomed = queue.submit({"n": 1})
    kept = queue.submit({"n": 2})
    cancelled = queue.cancel(doomed.id)
    assert cancelled is not None
    assert cancelled.status == "cancelled"
    assert queue.depth() == 1
    assert [job.id for job in queue.take("w1", 10, 0)] == [kept.id]
    assert queue.get(doomed.id).status == "cancelled"  # type: ignore[union-attr]
    running = queue.cancel(kept.id)  # too late: it runs to its end
    assert running is not None
    assert running.status == "running"


def test_finished_jobs_expire_after_the_ttl(make_queue: MakeQueue) -> None:
    queue = make_queue(jobs_ttl_s=0.2, jobs_max_attempts=1)
    done, failed, cancelled, queued = (queue.submit({"n": n}) for n in range(4))
    queue.cancel(cancelled.id)
    first, second = queue.take("w1", 2, 0)
    queue.complete(first, {"ok": True})
    queue.fail(second, {"type": "model_error", "message": "no"})
    for job in (done, failed, cancelled):
        wait_for(
            lambda job=job: queue.get(job.id) is None,
            f"{job.id} to expire",
            timeout_s=POLL_TIMEOUT_S,
        )
    assert queue.dead_letters() == []
    assert queue.get(queued.id) is not None  # unfinished jobs never expire


def test_submit_past_the_queue_limit_raises_queue_full(make_queue: MakeQueue) -> None:
    queue = make_queue(jobs_max_queue=3)
    jobs = [queue.submit({"n": n}, idempotency_key=str(n)) for n in range(3)]
    with pytest.raises(QueueFull) as refused:
        queue.submit({"n": 3})
    assert refused.value.retry_after_s > 0
    assert queue.submit({"n": 0}, idempotency_key="0").id == jobs[0].id  # not a new job
    [taken] = queue.take("w1", 1, 0)
    queue.complete(taken, {"ok": True})
    queue.submit({"n": 3})


def test_release_hands_jobs_back_without_counting_an_attempt(make_queue: MakeQueue) -> None:
    queue = make_queue()
    ids = [queue.submit({"n": n}).id for n in range(2)]
    held = queue.take("stopping", 2, 0)
    queue.release(held)
    for job_id in ids:
        job = queue.get(job_id)
        assert job is not None
        assert (job.status, job.attempts) == ("queued", 0)
    again = queue.take("w2", 2, 0)
    assert sorted(job.id for job in again) == sorted(ids)
    assert [job.attempts for job in again] == [1, 1]


def test_depth_counts_queued_and_running_jobs(make_queue: MakeQueue) -> None:
    queue = make_queue()
    assert queue.depth() == 0
    jobs = [queue.submit({"n": n}) for n in range(4)]
    first, second = queue.take("w1", 2, 0)
    assert queue.depth() == 4
    queue.complete(first, {"ok": True})
    queue.cancel(jobs[3].id)
    assert queue.depth() == 2
    queue.fail(second, {"type": "model_error", "message": "retry"})
    assert queue.depth() == 2
    for job in queue.take("w1", 2, 0):
        queue.complete(job, {"ok": True})
    assert queue.depth() == 0


def test_queue_names_are_checked(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="queue name"):
        open_queue(Settings(jobs_path=str(tmp_path / "jobs.db")), "a/b")


def test_the_job_modules_import_no_flask_and_sqlite_imports_no_redis(tmp_path: Any) -> None:
    code = (
        "import sys\n"
        "from serving_core.jobs.backends import open_queue\n"
        "from serving_core.settings import Settings\n"
        "import serving_core.jobs.sqlite.queue\n"
        f"open_queue(Settings(jobs_path={str(tmp_path / 'j.db')!r}), 'q').depth()\n"
        "assert 'redis' not in sys.modules, 'redis'\n"
        "import serving_core.jobs.redis.queue\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'flask'], 'flask'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
