"""`serving-core worker` end to end, on both queue backends: jobs submitted through a real
gunicorn server, consumed in batches by a real worker with two consumer processes."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis
import requests

from serving_core.jobs.backends import open_queue
from serving_core.settings import Settings
from tests.conftest import PROBE
from tests.redis_server import redis_server
from tests.servers import ROOT, gunicorn_server, job_worker, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "redis"])
def queue_env(request, tmp_path):
    if request.param == "sqlite":
        # One file for the web server and the worker: the embedded backend.
        return {"SERVING_JOBS_PATH": str(tmp_path / "jobs.db")}
    url = request.getfixturevalue("redis_url")
    # A queue of its own per test, since the probe's queue name is shared: an empty
    # database (a name's hash picked one, and two tests could meet in it; a
    # consumer's heartbeat left by another test hid a missing one's hint).
    own = url.replace("/0", "/1")
    with redis.Redis.from_url(own) as client:
        client.flushdb()
    return {"SERVING_JOBS_URL": own}


def submit(session, url, params, **headers):
    response = session.post(url + "/jobs", json=params, headers=headers, timeout=10)
    assert response.status_code == 202, response.text
    return response.json()["job_id"]


def statuses(session, url, ids):
    return {job_id: session.get(f"{url}/jobs/{job_id}", timeout=10).json() for job_id in ids}


def consumers(master_pid):
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return [int(pid) for pid in children]


def test_a_thousand_jobs_through_gunicorn_are_all_done_with_their_results(queue_env, tmp_path):
    env = {"SERVING_WORKERS": "2", "SERVING_MAX_BATCH_SIZE": "16", **queue_env}
    with gunicorn_server({"SERVING_HANDLER": PROBE, **env}) as server, job_worker(env, tmp_path):
        session = requests.Session()
        ids = [submit(session, server.url, {"text": f"job-{n}"}) for n in range(1000)]
        assert len(set(ids)) == 1000

        def all_done():
            last = session.get(f"{server.url}/jobs/{ids[-1]}", timeout=10).json()
            return last["status"] == "done"

        wait_for(all_done, "the last job", timeout_s=120)
        jobs = statuses(session, server.url, ids)
    assert {job["status"] for job in jobs.values()} == {"done"}
    assert [jobs[i]["result"]["text"] for i in ids] == [f"job-{n}" for n in range(1000)]
    # Consumed in batches, by both consumer processes.
    assert max(job["result"]["batch_size"] for job in jobs.values()) > 1
    assert len({job["result"]["pid"] for job in jobs.values()}) == 2


def test_a_consumer_killed_mid_batch_loses_no_job(queue_env, tmp_path):
    env = {
        "SERVING_WORKERS": "2",
        "SERVING_MAX_BATCH_SIZE": "4",
        "SERVING_JOBS_LEASE_S": "2",
        **queue_env,
    }
    with gunicorn_server({"SERVING_HANDLER": PROBE, **env}) as server:
        session = requests.Session()
        ids = [
            # Batches of 2 s: a job seen running is still in its consumer's hands when
            # the kill lands (with 0.5 s ones it could finish first, and the victim be idle).
            submit(session, server.url, {"text": f"slow-{n}", "sleep_s": 2})
            for n in range(12)
        ]
        with job_worker(env, tmp_path) as (process, _, log_path):
            wait_for(
                lambda: any(
                    j["status"] == "running" for j in statuses(session, server.url, ids).values()
                ),
                "a running job",
                timeout_s=30,
            )
            # Every consumer, so that whichever holds the running job is killed
            # mid-batch (the first child may be between two batches).
            for victim in consumers(process.pid):
                os.kill(victim, signal.SIGKILL)
            wait_for(
                lambda: all(
                    j["status"] == "done" for j in statuses(session, server.url, ids).values()
                ),
                lambda: f"every job done after the kill:\n{log_path.read_text()}",
                timeout_s=90,
            )
            jobs = statuses(session, server.url, ids)
            assert "starting another" in log_path.read_text()
    assert [jobs[i]["result"]["text"] for i in ids] == [f"slow-{n}" for n in range(12)]
    assert any(job["attempts"] > 1 for job in jobs.values())  # the victim's, handed out again


def test_a_job_that_always_fails_ends_failed_after_max_attempts(queue_env, tmp_path):
    env = {"SERVING_WORKERS": "1", "SERVING_JOBS_MAX_ATTEMPTS": "3", **queue_env}
    with gunicorn_server({"SERVING_HANDLER": PROBE, **env}) as server, job_worker(env, tmp_path):
        session = requests.Session()
        failing = submit(session, server.url, {"text": "x", "fail": True})
        fine = submit(session, server.url, {"text": "y"})
        wait_for(
            lambda: (
                session.get(f"{server.url}/jobs/{failing}", timeout=10).json()["status"] == "failed"
            ),
            "the failing job to end",
            timeout_s=60,
        )
        wait_for(
            lambda: session.get(f"{server.url}/jobs/{fine}", timeout=10).json()["status"] == "done",
            "the fine job",
            timeout_s=60,
        )
        job = session.get(f"{server.url}/jobs/{failing}", timeout=10).json()
    assert job["attempts"] == 3
    assert job["error"]["type"] == "model_error"


def test_idempotency_cancel_and_expiry_through_the_server(queue_env, tmp_path):
    env = {"SERVING_WORKERS": "1", "SERVING_JOBS_TTL_S": "1", **queue_env}
    with gunicorn_server({"SERVING_HANDLER": PROBE, **env}) as server:
        session = requests.Session()
        key = {"Idempotency-Key": "req-42"}
        first = submit(session, server.url, {"text": "once"}, **key)
        assert submit(session, server.url, {"text": "once"}, **key) == first
        cancelled = submit(session, server.url, {"text": "never"})
        assert session.delete(f"{server.url}/jobs/{cancelled}", timeout=10).status_code == 200
        with job_worker(env, tmp_path) as (_, health_url, _):
            wait_for(
                lambda: (
                    session.get(f"{server.url}/jobs/{first}", timeout=10).json()["status"] == "done"
                ),
                "the job",
                timeout_s=60,
            )
            metrics = requests.get(health_url + "/metrics", timeout=10).text
        assert 'serving_jobs_total{result="done"} 1.0' in metrics
        assert "serving_job_wait_seconds_count 1.0" in metrics  # the cancelled one never ran
        # The cancelled job never ran; past the TTL, both answers expire.
        wait_for(
            lambda: session.get(f"{server.url}/jobs/{first}", timeout=10).status_code == 404,
            "the result to expire",
            timeout_s=30,
        )
        gone = session.get(f"{server.url}/jobs/{cancelled}", timeout=10)
    assert gone.status_code == 404
    assert gone.json()["error"]["type"] == "not_found"


def test_a_batch_running_longer_than_the_lease_renews_it_and_runs_once(queue_env, tmp_path):
    seen = tmp_path / "seen.txt"
    env = {
        "SERVING_WORKERS": "2",
        "SERVING_JOBS_LEASE_S": "0.6",
        "SERVING_JOBS_MAX_ATTEMPTS": "1",
        "PROBE_SEEN_FILE": str(seen),
        **queue_env,
    }
    with gunicorn_server({"SERVING_HANDLER": PROBE, **env}) as server, job_worker(env, tmp_path):
        session = requests.Session()
        # Three leases long: without renewal the other consumer would take it again,
        # and with one attempt allowed it would end failed.
        job_id = submit(session, server.url, {"id": "long", "sleep_s": 1.8})
        wait_for(
            lambda: (
                session.get(f"{server.url}/jobs/{job_id}", timeout=10).json()["status"]
                in ("done", "failed")
            ),
            "the long job",
            timeout_s=60,
        )
        job = session.get(f"{server.url}/jobs/{job_id}", timeout=10).json()
    assert job["status"] == "done", job
    assert job["attempts"] == 1
    assert seen.read_text().split() == ["long"]


def test_a_worker_of_another_handler_leaves_the_job_queued_with_a_hint_until_the_right_one(
    queue_env, tmp_path
):
    """The README's old jobs example: a worker started without the API's SERVING_HANDLER
    consumes another handler's queue, and the job would wait silently for ever."""
    env = {"SERVING_WORKERS": "1", **queue_env}
    other = {"SERVING_HANDLER": str(ROOT / "tests/handlers/fuzz/handler.py")}
    with gunicorn_server({"SERVING_HANDLER": PROBE, **env}) as server:
        session = requests.Session()
        job_id = submit(session, server.url, {"text": "waits"})

        def gauge(name):
            line = f'{name}{{queue="probe"}} '
            text = session.get(server.url + "/metrics", timeout=10).text
            [value] = [row[len(line) :] for row in text.splitlines() if row.startswith(line)]
            return float(value)

        with job_worker({**env, **other}, tmp_path):
            # Once the wrong worker polls its own queue, the job is still queued, with a hint.
            wait_for(
                lambda: polled(queue_env, "fuzz"),
                "the other handler's worker to poll its queue",
                timeout_s=60,
            )
            job = session.get(f"{server.url}/jobs/{job_id}", timeout=10).json()
            assert job["status"] == "queued"
            assert "no serving-core worker has taken jobs from queue 'probe'" in job["hint"]
            assert "this server's SERVING_HANDLER" in job["hint"]
            assert str(PROBE) not in job["hint"]  # a path is the operator's, in the log
            assert gauge("serving_job_consumers") == 0
            assert gauge("serving_job_queue_unpolled_seconds") == float("inf")
            assert gauge("serving_job_queue_depth") == 1
        with job_worker(env, tmp_path):
            wait_for(
                lambda: (
                    session.get(f"{server.url}/jobs/{job_id}", timeout=10).json()["status"]
                    == "done"
                ),
                "the job, once its own handler's worker runs",
                timeout_s=60,
            )
            done = session.get(f"{server.url}/jobs/{job_id}", timeout=10).json()
            assert "hint" not in done
            assert gauge("serving_job_consumers") == 1
            assert gauge("serving_job_queue_unpolled_seconds") < 60
            assert gauge("serving_job_queue_depth") == 0


def polled(queue_env, queue):
    """Whether a consumer has polled ``queue`` in the store ``queue_env`` names."""
    settings = Settings.from_env(queue_env)
    opened = open_queue(settings, queue)
    try:
        return opened.consumers(60).live > 0
    finally:
        opened.close()
