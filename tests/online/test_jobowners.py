"""/jobs with API keys: a job is its key's, an Idempotency-Key is bound to its body, the
store and each key are bounded; and the time-lag follow-up of a repeated request. Over
the Flask test client, on both backends (SQLite, a real Redis) where the backend matters."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.conftest import make_app
from tests.jobs.conftest import POLL_TIMEOUT_S
from tests.online.test_jobsapi import consume
from tests.redis_server import redis_server
from tests.servers import wait_for
from tests.web.test_app import assert_error

ALICE, BOB = "alice-6f0e9a8b7c6d5e4f3a2b", "bob-0c1d2e3f4a5b6c7d8e9f"


def as_(key: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **headers}


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture
def started() -> Iterator[Callable[..., tuple[Any, Any]]]:
    services: list[Any] = []

    def start(**env: Any) -> tuple[Any, Any]:
        app = make_app(max_wait_ms=1, api_keys=f"{ALICE},{BOB}", **env)
        service = app.extensions["serving_core"]
        service.start()
        services.append(service)
        return app.test_client(), service

    yield start
    for service in services:
        service.stop()


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.e2e)])
def backend(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "sqlite":
        return {}
    url = request.getfixturevalue("redis_url")
    # Every app's queue is the probe's: each test starts from an empty Redis.
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    return {"jobs_url": url}


def test_another_keys_job_is_a_404_like_an_unknown_one(started, backend) -> None:
    client, _ = started(**backend)
    posted = client.post("/jobs", json={"text": "mine"}, headers=as_(ALICE))
    assert posted.status_code == 202
    url = posted.get_json()["status_url"]
    unknown = assert_error(client.get("/jobs/" + "0" * 32, headers=as_(BOB)), 404, "not_found")
    for response in (client.get(url, headers=as_(BOB)), client.delete(url, headers=as_(BOB))):
        error = assert_error(response, 404, "not_found")
        assert error["message"].split(":", 1)[1] == unknown["message"].split(":", 1)[1]
    assert client.get(url, headers=as_(ALICE)).get_json()["status"] == "queued"  # not cancelled
    assert client.delete(url, headers=as_(ALICE)).get_json()["status"] == "cancelled"


def test_an_idempotency_key_with_another_body_is_a_422_and_never_crosses_keys(
    started, backend
) -> None:
    client, _ = started(**backend)
    key = {"Idempotency-Key": "invoice-1001"}
    first = client.post("/jobs", json={"text": "a"}, headers=as_(ALICE, **key))
    again = client.post("/jobs", json={"text": "a"}, headers=as_(ALICE, **key))
    assert first.status_code == again.status_code == 202
    assert again.get_json()["job_id"] == first.get_json()["job_id"]
    reused = client.post("/jobs", json={"text": "b"}, headers=as_(ALICE, **key))
    error = assert_error(reused, 422, "unprocessable")
    assert "Idempotency-Key" in error["message"]
    # Bob's "invoice-1001" is his own key: his own job, and no sign that Alice used it.
    bobs = client.post("/jobs", json={"text": "b"}, headers=as_(BOB, **key))
    assert bobs.status_code == 202
    assert bobs.get_json()["job_id"] != first.get_json()["job_id"]
    assert_error(
        client.post("/jobs", json={"text": "c"}, headers=as_(BOB, **key)), 422, "unprocessable"
    )


def test_a_key_past_its_quota_is_a_429_with_retry_after(started, backend) -> None:
    client, service = started(jobs_max_per_caller=1, **backend)
    assert client.post("/jobs", json={"text": "a"}, headers=as_(ALICE)).status_code == 202
    refused = client.post("/jobs", json={"text": "b"}, headers=as_(ALICE))
    assert_error(refused, 429, "too_many_requests")
    assert int(refused.headers["Retry-After"]) >= 1
    assert client.post("/jobs", json={"text": "c"}, headers=as_(BOB)).status_code == 202
    assert consume(service) == 2
    assert client.post("/jobs", json={"text": "d"}, headers=as_(ALICE)).status_code == 202
    # Jobs finished lately, yet a key's quota keeps the fixed 1 s: what frees its place
    # is one of its own jobs finishing, which the queue's drain rate does not tell.
    again = client.post("/jobs", json={"text": "e"}, headers=as_(ALICE))
    assert_error(again, 429, "too_many_requests")
    assert again.headers["Retry-After"] == "1"


def test_a_full_queue_is_a_503_whose_retry_after_follows_the_drain_rate(started, backend) -> None:
    client, service = started(jobs_max_queue=2, **backend)

    def post() -> Any:
        return client.post("/jobs", json={"text": "a"}, headers=as_(ALICE))

    assert [post().status_code, post().status_code] == [202, 202]
    full = post()
    assert_error(full, 503, "overloaded")
    assert full.headers["Retry-After"] == "1"  # nothing finished yet: nothing to go by
    assert consume(service) == 2
    assert [post().status_code, post().status_code] == [202, 202]
    # Two jobs finished within the last minute: a place frees in about 30 s.
    assert post().headers["Retry-After"] == "30"


def test_a_full_sqlite_store_is_a_503_with_retry_after_and_takes_jobs_after_the_ttl(
    started,
) -> None:
    client, service = started(jobs_max_stored=2, jobs_ttl_s=1)
    for text in ("a", "b"):
        assert client.post("/jobs", json={"text": text}, headers=as_(ALICE)).status_code == 202
    assert consume(service) == 2  # finished: they stay readable for the TTL
    full = client.post("/jobs", json={"text": "c"}, headers=as_(BOB))
    assert_error(full, 503, "overloaded")
    assert int(full.headers["Retry-After"]) == 1  # when the oldest expires

    def accepted() -> bool:
        return client.post("/jobs", json={"text": "c"}, headers=as_(BOB)).status_code == 202

    wait_for(accepted, "the store to take jobs again after SERVING_JOBS_TTL_S", POLL_TIMEOUT_S)
    with sqlite3.connect(service.settings.jobs_path) as db:
        assert db.execute("SELECT count(*) FROM jobs").fetchone()[0] == 1  # the two purged


def test_a_repeated_predict_shares_its_follow_up_job_and_queues_no_other(started) -> None:
    client, service = started(followup_queue="slow-model", cache_header=True)
    first = client.post("/predict", json={"text": "now"}, headers=as_(ALICE))
    hit = client.post("/predict", json={"text": "now"}, headers=as_(ALICE))
    assert hit.headers.get("X-Cache") == "hit"
    assert hit.get_json()["job_id"] == first.get_json()["job_id"]
    assert service.jobs.followup.depth() == 1
    # Another key's identical request is its own job, which it can read.
    bobs = client.post("/predict", json={"text": "now"}, headers=as_(BOB)).get_json()
    assert bobs["job_id"] != first.get_json()["job_id"]
    assert client.get(bobs["status_url"], headers=as_(BOB)).status_code == 200
    assert client.get(bobs["status_url"], headers=as_(ALICE)).status_code == 404
