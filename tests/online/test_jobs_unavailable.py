"""A job queue that cannot answer is a 503 that names no host, port or path: the detail
goes to the server's log, where the operator reads it."""

from __future__ import annotations

import logging
import sqlite3

import pytest

from tests.conftest import make_app
from tests.web.test_app import assert_error


@pytest.fixture
def started():
    services = []

    def start(**env):
        app = make_app(max_wait_ms=1, jobs_enabled="true", **env)
        service = app.extensions["serving_core"]
        service.start()
        services.append(service)
        return app, service

    yield start
    for service in services:
        service.stop()


def test_an_unreachable_redis_queue_is_a_503_without_its_address(started, caplog):
    app, _ = started(jobs_url="redis://127.0.0.1:1/0")  # nothing listens on port 1
    client = app.test_client()
    with caplog.at_level(logging.WARNING, logger="serving_core.jobs"):
        response = client.post("/jobs", json={"text": "a"})
    assert_error(response, 503, "not_ready")
    assert "127.0.0.1" not in response.get_data(as_text=True)
    assert ":1" not in response.get_json()["error"]["message"]
    assert "127.0.0.1:1" in caplog.text  # the operator still learns where


def test_a_broken_sqlite_queue_is_a_503_without_its_path(started, caplog):
    app, service = started()
    path = service.settings.jobs_path
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE jobs")  # every query of the queue now fails
    client = app.test_client()
    with caplog.at_level(logging.WARNING, logger="serving_core.jobs"):
        response = client.get("/jobs/0123456789abcdef")
    assert_error(response, 503, "not_ready")
    assert path not in response.get_data(as_text=True)
    assert "jobs.db" not in response.get_data(as_text=True)
    assert path in caplog.text
