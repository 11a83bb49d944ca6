"""SERVING_LOG_FORMAT=json: every line a real server or worker writes is one JSON object."""

from __future__ import annotations

import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serving_core.logs import JsonFormatter, formatter
from tests.conftest import PROBE
from tests.servers import gunicorn_server, job_worker

pytestmark = pytest.mark.e2e

KEYS = {"time", "level", "logger", "message"}


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord(
        "serving_core.web.app", logging.WARNING, __file__, 1, message, args, None
    )
    made.__dict__.update(extra)
    return made


def test_a_json_line_has_time_level_logger_message_and_the_fields():
    line = JsonFormatter().format(record("request %s failed", "r1", fields={"request_id": "r1"}))
    entry = json.loads(line)
    assert entry.keys() >= KEYS
    assert (entry["level"], entry["logger"]) == ("warning", "serving_core.web.app")
    assert (entry["message"], entry["request_id"]) == ("request r1 failed", "r1")
    assert entry["time"].endswith("+00:00")


def test_a_traceback_stays_inside_the_one_json_line():
    try:
        raise ValueError("boom")
    except ValueError:
        made = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), None)
        made.exc_info = sys.exc_info()
    line = JsonFormatter().format(made)
    assert "\n" not in line
    assert "ValueError: boom" in json.loads(line)["exception"]


def test_text_stays_the_default_format():
    assert not isinstance(formatter("text"), JsonFormatter)
    line = formatter("text").format(record("plain"))
    assert "[WARNING] serving_core.web.app: plain" in line


def parse_lines(output: str) -> list[dict[str, object]]:
    entries = []
    for number, line in enumerate(output.splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:
            pytest.fail(f"line {number} is not JSON: {line!r}")
        assert isinstance(entry, dict), line
        assert entry.keys() >= KEYS, line
        entries.append(entry)
    return entries


def test_every_line_of_a_server_under_load_is_json_and_access_lines_carry_the_request_id():
    env = {"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "2", "SERVING_LOG_FORMAT": "json"}
    with gunicorn_server(env) as server:

        def call(n: int) -> tuple[str, int, str, int | None]:
            if n % 50 == 7:  # a few errors: a 400 and a 404 log too
                response = requests.post(
                    server.url + "/predict",
                    data="{",
                    headers={"Content-Type": "application/json"},
                    timeout=30,
                )
            elif n % 50 == 9:
                response = requests.get(server.url + "/nowhere", timeout=30)
            else:
                response = requests.post(
                    server.url + "/predict", json={"text": f"t{n}"}, timeout=30
                )
            # The probe says the size of the batch that ran it; errors ran in none.
            batch = response.json().get("batch_size") if response.status_code == 200 else None
            return (
                response.request.path_url,
                response.status_code,
                response.headers["X-Request-ID"],
                batch,
            )

        with ThreadPoolExecutor(8) as pool:
            sent = list(pool.map(call, range(200)))
        assert {status for _, status, _, _ in sent} == {200, 400, 404}
        expected = {request_id: (path, status, batch) for path, status, request_id, batch in sent}

        # The access line is written after the response: wait until all are there.
        deadline = time.monotonic() + 30
        while not all(f'"request_id":"{i}"' in server.output() for i in expected):
            assert time.monotonic() < deadline, server.output()[-2000:]
            time.sleep(0.05)
        entries = parse_lines(server.output())

    access = [e for e in entries if e["logger"] == "gunicorn.access"]
    for entry in access:
        assert entry["request_id"] not in (None, "", "-"), entry
        assert isinstance(entry["duration_ms"], float | int)
    logged = {e["request_id"]: e for e in access}
    for request_id, (path, status, batch) in expected.items():
        entry = logged[request_id]
        assert (entry["path"], entry["status"], entry["method"]) == (
            path,
            status,
            "GET" if path == "/nowhere" else "POST",
        )
        assert entry["route"] == ("unmatched" if path == "/nowhere" else "/predict")
        assert entry["batch_size"] == batch, entry
    assert any(e["batch_size"] and e["batch_size"] > 1 for e in access)  # 8 clients batch
    loggers = {e["logger"] for e in entries}
    # gunicorn's own lines, serving-core's and the handler's are JSON alike.
    assert {"gunicorn.error", "serving_core.process.server", "probe"} <= loggers


def test_every_line_of_a_job_worker_is_json(tmp_path):
    queue = {"SERVING_JOBS_PATH": str(tmp_path / "jobs.db"), "SERVING_WORKERS": "1"}
    env = {"SERVING_HANDLER": PROBE, "SERVING_LOG_FORMAT": "json", **queue}
    with gunicorn_server(env) as server, job_worker(env, tmp_path) as (_, _, log_path):
        job = requests.post(server.url + "/jobs", json={"text": "queued"}, timeout=10).json()
        deadline = time.monotonic() + 60
        while requests.get(server.url + job["status_url"], timeout=10).json()["status"] != "done":
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
    entries = parse_lines(log_path.read_text())
    assert any(e["logger"] == "serving_core.process.jobmaster" for e in entries)
