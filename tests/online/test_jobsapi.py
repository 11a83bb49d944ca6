"""POST /jobs, GET and DELETE /jobs/<id> through the Flask test client, over the embedded
(SQLite) queue; a consumer's batch in between, as `serving-core worker`'s loop runs it."""

from __future__ import annotations

import pytest

from serving_core.loops.jobs import JobLoop
from tests.conftest import make_app
from tests.web.test_app import assert_error


@pytest.fixture
def started():
    apps = []

    def start(**env):
        app = make_app(max_wait_ms=1, **env)
        service = app.extensions["serving_core"]
        service.start()
        apps.append(service)
        return app, service

    yield start
    for service in apps:
        service.stop()


def consume(service, max_items=16):
    """One batch of a job consumer's loop, over the service's own queue and engine."""
    loop = JobLoop(
        service.engine, service.jobs.queue, "test", max_batch_size=max_items, stopping=lambda: True
    )
    jobs = service.jobs.queue.take("test", max_items, 0.0)
    if jobs:
        loop.run_batch(jobs)
    return len(jobs)


def test_a_job_is_accepted_with_202_and_its_result_appears_at_its_status_url(started):
    app, service = started()
    client = app.test_client()
    response = client.post("/jobs", json={"text": "later"})
    assert response.status_code == 202
    body = response.get_json()
    assert response.headers["Location"] == body["status_url"] == f"/jobs/{body['job_id']}"
    assert len(body["job_id"]) >= 32
    queued = client.get(body["status_url"]).get_json()
    assert queued["status"] == "queued"
    assert "result" not in queued
    assert consume(service) == 1
    done = client.get(body["status_url"]).get_json()
    assert done["status"] == "done"
    assert done["result"]["text"] == "later"
    assert done["attempts"] == 1
    assert done["finished_at"] is not None


def test_a_job_with_bad_params_is_refused_at_once(started):
    app, _ = started()
    error = assert_error(app.test_client().post("/jobs", json={"n": -1}), 400, "invalid_input")
    assert error["details"][0]["field"] == "n"


def test_an_item_the_handler_rejects_fails_without_retries(started):
    app, service = started()
    client = app.test_client()
    url = client.post("/jobs", json={"text": "x", "bad": True}).get_json()["status_url"]
    consume(service)
    job = client.get(url).get_json()
    assert job["status"] == "failed"
    assert job["error"]["type"] == "invalid_input"
    assert job["attempts"] == 1


def test_the_same_idempotency_key_returns_the_same_job(started):
    app, _ = started()
    client = app.test_client()
    first = client.post("/jobs", json={"text": "a"}, headers={"Idempotency-Key": "order-17"})
    again = client.post("/jobs", json={"text": "a"}, headers={"Idempotency-Key": "order-17"})
    other = client.post("/jobs", json={"text": "a"}, headers={"Idempotency-Key": "order-18"})
    assert first.get_json()["job_id"] == again.get_json()["job_id"]
    assert other.get_json()["job_id"] != first.get_json()["job_id"]
    bad = client.post("/jobs", json={"text": "a"}, headers={"Idempotency-Key": "no spaces"})
    assert_error(bad, 400, "bad_request")


def test_a_cancelled_job_never_runs_and_a_finished_one_cannot_be_cancelled(started):
    app, service = started()
    client = app.test_client()
    cancelled = client.post("/jobs", json={"text": "no"}).get_json()["status_url"]
    response = client.delete(cancelled)
    assert response.status_code == 200
    assert response.get_json()["status"] == "cancelled"
    finished = client.post("/jobs", json={"text": "yes"}).get_json()["status_url"]
    assert consume(service) == 1  # only the one not cancelled
    assert client.get(cancelled).get_json()["status"] == "cancelled"
    assert_error(client.delete(finished), 409, "conflict")


def test_an_unknown_job_is_a_404(started):
    app, _ = started()
    client = app.test_client()
    assert_error(client.get("/jobs/0123456789abcdef"), 404, "not_found")
    assert_error(client.delete("/jobs/0123456789abcdef"), 404, "not_found")


def test_a_full_job_queue_is_a_503_with_retry_after(started):
    app, _ = started(jobs_max_queue=1)
    client = app.test_client()
    assert client.post("/jobs", json={"text": "a"}).status_code == 202
    response = client.post("/jobs", json={"text": "b"})
    assert_error(response, 503, "overloaded")
    assert response.headers["Retry-After"] == "1"  # no job finished yet: the fixed 1 s


def test_jobs_switched_off_are_not_routes(started):
    app, _ = started(jobs_enabled="false")
    client = app.test_client()
    assert_error(client.post("/jobs", json={"text": "a"}), 404, "not_found")
    assert "/jobs" not in client.get("/openapi.json").get_json()["paths"]


def test_the_job_routes_are_in_the_openapi_document(started):
    app, _ = started()
    paths = app.test_client().get("/openapi.json").get_json()["paths"]
    assert set(paths["/jobs"]) == {"post"}
    assert set(paths["/jobs/{job_id}"]) == {"get", "delete"}


def test_time_lag_answers_now_and_queues_the_slow_handlers_job(started):
    app, service = started(followup_queue="slow-model")
    client = app.test_client()
    response = client.post("/predict", json={"text": "now"})
    assert response.status_code == 200
    body = response.get_json()
    assert body["text"] == "now"  # the fast handler's answer, at once
    job = client.get(body["status_url"]).get_json()
    assert job["job_id"] == body["job_id"]
    assert job["status"] == "queued"
    assert service.jobs.followup.take("slow", 1, 0.0)[0].params == {"text": "now"}


def test_a_queued_job_nobody_consumes_says_which_worker_to_start(started):
    app, service = started()
    client = app.test_client()
    url = client.post("/jobs", json={"text": "waits"}).get_json()["status_url"]
    job = client.get(url).get_json()
    assert job["status"] == "queued"
    hint = job["hint"]
    assert "no serving-core worker has taken jobs from queue 'probe'" in hint
    assert "this server's SERVING_HANDLER and SERVING_JOBS_PATH" in hint
    assert service.settings.jobs_path not in hint  # the operator's, in the log
    consume(service)  # a consumer polls the queue: a live one
    assert "hint" not in client.get(url).get_json()  # done
    later = client.post("/jobs", json={"text": "next"}).get_json()["status_url"]
    queued = client.get(later).get_json()
    assert queued["status"] == "queued"
    assert "hint" not in queued


def test_metrics_name_each_queue_with_its_live_consumers_and_depth(started):
    app, service = started(followup_queue="slow-model")
    client = app.test_client()
    client.post("/jobs", json={"text": "waits"})

    def gauge(name, queue):
        line = f'{name}{{queue="{queue}"}} '
        text = client.get("/metrics").get_data(as_text=True)
        [value] = [row[len(line) :] for row in text.splitlines() if row.startswith(line)]
        return float(value)

    assert gauge("serving_job_consumers", "probe") == 0
    assert gauge("serving_job_queue_unpolled_seconds", "probe") == float("inf")
    assert gauge("serving_job_queue_depth", "probe") == 1
    assert gauge("serving_job_consumers", "slow-model") == 0  # the follow-up queue's too
    service.jobs.queue.take("w1", 1, 0.0)
    assert gauge("serving_job_consumers", "probe") == 1
    assert 0 <= gauge("serving_job_queue_unpolled_seconds", "probe") < 60
