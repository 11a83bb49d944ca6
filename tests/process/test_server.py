"""End to end: a real ``serving-core serve`` (gunicorn, preload, gevent/gthread) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.conftest import HANDLERS, PROBE
from tests.servers import ROOT, SERVING_CORE, base_env, gunicorn_server, wait_for

pytestmark = pytest.mark.e2e

# The behaviours that depend on how a worker waits run with both worker classes.
each_worker_class = pytest.mark.parametrize("worker_class", ["gevent", "gthread"])


def post(url, payload, **kwargs):
    return requests.post(url + "/predict", json=payload, timeout=30, **kwargs)


def worker_pids(log):
    return {int(m) for m in re.findall(r"worker (\d+) ready", log)}


def parent_pid(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_model_is_loaded_once_in_the_master_and_shared_by_two_workers():
    with gunicorn_server({"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "2"}) as server:
        master = server.pid
        answers = [post(server.url, {"text": str(i)}).json() for i in range(10)]
        workers = worker_pids(server.output())
        parents = {parent_pid(pid) for pid in workers}
        log = server.output()
    assert len(workers) == 2
    assert parents == {master}
    assert log.count("ready: no torch") == 2  # the probe handler never imports torch
    assert log.count("probe setup in pid") == 1
    assert f"probe setup in pid {master}" in log
    assert {a["setup_pid"] for a in answers} == {master}
    assert {a["pid"] for a in answers} <= workers


@each_worker_class
def test_32_concurrent_clients_are_batched_and_each_gets_its_own_answer(worker_class):
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKER_CLASS": worker_class,
        "SERVING_WORKERS": "2",
        "SERVING_MAX_BATCH_SIZE": "16",
    }
    with gunicorn_server(env) as server:
        barrier = threading.Barrier(32)

        def client(n):
            session = requests.Session()
            barrier.wait()
            results = []
            for round_ in range(5):
                text = f"client-{n}-round-{round_}"
                response = session.post(
                    server.url + "/predict", json={"text": text, "sleep_s": 0.02}, timeout=30
                )
                results.append((text, response.status_code, response.json()))
            return results

        with ThreadPoolExecutor(32) as pool:
            results = [r for rs in pool.map(client, range(32)) for r in rs]
    assert len(results) == 160
    for text, status, body in results:
        assert status == 200
        assert body["text"] == text
    assert max(body["batch_size"] for _, _, body in results) > 1
    assert max(body["batch_size"] for _, _, body in results) <= 16


@each_worker_class
def test_a_full_queue_answers_503_at_once_with_retry_after(tmp_path, worker_class):
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKER_CLASS": worker_class,
        "SERVING_WORKERS": "1",
        "SERVING_THREADS": "8",
        "SERVING_MAX_BATCH_SIZE": "1",
        "SERVING_MAX_QUEUE": "1",
        # Only a guard against a hang: the gate, not a deadline, ends the held request.
        "SERVING_REQUEST_TIMEOUT_S": "300",
    }
    with gunicorn_server(env) as server, ThreadPoolExecutor(2) as pool:
        try:
            running = pool.submit(post, server.url, {"gate": str(tmp_path)})
            wait_for((tmp_path / "started").exists, "the first request in the model", 60)
            queued = pool.submit(post, server.url, {"text": "queued"})
            wait_for(lambda: queue_depth(server.url) == 1, "the second request queued", 60)
            # Answered while the gate still holds both: at once, not queued behind them.
            refused = post(server.url, {"text": "refused"})
        finally:
            (tmp_path / "open").touch()
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "overloaded"
        assert int(refused.headers["Retry-After"]) >= 1
        assert running.result().status_code == 200
        assert queued.result().status_code == 200


def queue_depth(url: str) -> int:
    metadata = requests.get(url + "/metadata", timeout=30).json()
    return int(metadata["batching"]["queue_depth"])


@each_worker_class
def test_a_slow_handler_gives_504_and_the_expired_item_never_reaches_it(tmp_path, worker_class):
    seen_file = tmp_path / "seen.txt"
    gate = tmp_path / "gate"
    gate.mkdir()
    env = {
        "PROBE_SEEN_FILE": str(seen_file),
        "SERVING_WORKER_CLASS": worker_class,
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "1",
        "SERVING_MAX_BATCH_SIZE": "1",
        "SERVING_REQUEST_TIMEOUT_S": "0.5",
        "SERVING_BATCH_POLICY": "fixed",
        # The gate holds the batch past its deadline for as long as the test takes:
        # the watchdog must not take that for a hung model and replace the worker.
        "SERVING_HANG_MARGIN_S": "300",
    }
    with gunicorn_server(env) as server, ThreadPoolExecutor(2) as pool:
        observed = batches_observed(server.url)
        try:
            slow = pool.submit(post, server.url, {"id": "slow", "gate": str(gate)})
            wait_for((gate / "started").exists, "the slow request in the model", 60)
            sent = time.monotonic()
            expired = post(server.url, {"id": "expired"})
            waited = time.monotonic() - sent
            # Both answered while the gate holds the model: at their deadline, not
            # after the batch ahead (which ends only when the gate opens, below).
            assert slow.result().status_code == 504  # it outlived its own deadline too
        finally:
            (gate / "open").touch()
        assert expired.status_code == 504
        assert expired.json()["error"]["type"] == "deadline_exceeded"
        # Not before the deadline: the server's clock starts after `sent` (one
        # CLOCK_MONOTONIC for both processes), so a load can only make this longer.
        assert waited >= 0.5
        # The held batch has taught the cost model that a batch takes over 0.5 s
        # (the gate stayed shut past both deadlines): a new request cannot meet it.
        wait_for(lambda: batches_observed(server.url) > observed, "the held batch observed", 60)
        refused = post(server.url, {"id": "refused"})
        assert refused.status_code == 503
        assert refused.json()["error"]["type"] == "overloaded"
        # A graceful stop runs whatever is still queued: had the expired item stayed
        # there, the model thread would reach it before the server exits.
        server.process.terminate()
        assert server.process.wait(30) == 0
    seen = seen_file.read_text().split()
    assert "slow" in seen
    assert "expired" not in seen


def batches_observed(url: str) -> int:
    metadata = requests.get(url + "/metadata", timeout=30).json()
    return int(metadata["batching"]["cost_model"]["batches_observed"])


def test_one_bad_item_in_a_batch_fails_alone():
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "1",
        "SERVING_BATCH_POLICY": "fixed",
        "SERVING_MAX_WAIT_MS": "300",
    }
    with gunicorn_server(env) as server:
        barrier = threading.Barrier(4)

        def client(payload):
            barrier.wait()
            return post(server.url, payload)

        payloads = [{"text": "a"}, {"text": "b", "bad": True}, {"text": "c"}, {"text": "d"}]
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(client, payloads))
        assert [r.status_code for r in responses] == [200, 400, 200, 200]
        assert responses[1].json()["error"] == {
            "type": "invalid_input",
            "message": "this item is bad",
        }
        assert [responses[i].json()["text"] for i in (0, 2, 3)] == ["a", "c", "d"]


@pytest.fixture(scope="module")
def probe_server():
    """The probe on one worker, for the tests here that only send it requests."""
    with gunicorn_server({"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1"}) as server:
        yield server


def test_a_raising_handler_is_a_json_500_logged_once_and_the_next_request_works(probe_server):
    server = probe_server
    failed = post(server.url, {"fail": True}, headers={"X-Request-ID": "boom-1"})
    after = post(server.url, {"text": "after"})
    # The access line (serving_core.process.accesslog), one per request, follows the response.
    line = r'^127\.0\.0\.1 "POST /predict HTTP/1\.1" 500 \d+ \d+ms request_id=boom-1$'

    def logged():
        log = server.output()
        return log if re.search(line, log, re.M) else ""

    log = wait_for(logged, "the access line of boom-1")
    assert failed.status_code == 500
    assert failed.json()["error"]["type"] == "model_error"
    assert "Traceback" not in failed.text
    assert "boom-1" in failed.json()["error"]["message"]
    assert after.status_code == 200
    assert log.count("request ids: boom-1") == 1
    assert "RuntimeError: the probe was asked to fail" in log
    assert failed.headers["X-Request-ID"] == "boom-1"


def test_computing_with_torch_in_setup_does_not_hang_the_forked_workers():
    pytest.importorskip("torch", reason="no handler here installs torch")
    # One worker gets both cores, so its torch uses OpenMP threads after fork.
    env = {"SERVING_HANDLER": str(HANDLERS / "forkwarm" / "handler.py"), "SERVING_WORKERS": "1"}
    with gunicorn_server(env, ready_timeout_s=30) as server:
        response = requests.post(server.url + "/predict", json={}, timeout=10)
    assert response.status_code == 200
    assert response.json()["threads"] == max(1, len(os.sched_getaffinity(0)))


@each_worker_class
def test_sigterm_drains_in_flight_requests(tmp_path, worker_class):
    env = {"SERVING_HANDLER": PROBE, "SERVING_WORKER_CLASS": worker_class, "SERVING_WORKERS": "1"}
    with gunicorn_server(env) as server:
        with ThreadPoolExecutor(1) as pool:
            try:
                payload = {"text": "drained", "gate": str(tmp_path)}
                in_flight = pool.submit(post, server.url, payload)
                wait_for((tmp_path / "started").exists, "the request in the model", 60)
                server.process.terminate()
                # The stop has begun while the model still holds the request.
                wait_for(lambda: "Handling signal: term" in server.output(), "the SIGTERM", 60)
            finally:
                (tmp_path / "open").touch()
            response = in_flight.result()
        assert server.process.wait(20) == 0
    assert response.status_code == 200
    assert response.json()["text"] == "drained"


@each_worker_class
def test_a_request_waiting_for_the_model_does_not_hold_up_the_others(tmp_path, worker_class):
    env = {"SERVING_HANDLER": PROBE, "SERVING_WORKER_CLASS": worker_class, "SERVING_WORKERS": "1"}
    with gunicorn_server(env) as server, ThreadPoolExecutor(1) as pool:
        try:
            slow = pool.submit(post, server.url, {"text": "slow", "gate": str(tmp_path)})
            wait_for((tmp_path / "started").exists, "the slow request in the model", 60)
            # Answered while the gate still holds the slow request in the model.
            health = requests.get(server.url + "/healthz", timeout=30)
            metadata = requests.get(server.url + "/metadata", timeout=30)
            assert not slow.done()
        finally:
            (tmp_path / "open").touch()
        assert slow.result().status_code == 200
    assert health.status_code == 200
    assert metadata.json()["worker_class"] == worker_class


def run_serve(env, timeout_s=60):
    return subprocess.run(
        [str(SERVING_CORE), "serve"],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SERVING_WORKERS": "many"}, "SERVING_WORKERS='many' is not an integer"),
        ({"SERVING_BIND": "nowhere"}, "SERVING_BIND='nowhere' is not HOST:PORT"),
        ({"SERVING_HANDLER": "handlers/none/handler.py"}, "handlers/none/handler.py does not"),
        (
            {"SERVING_HANDLER": str(HANDLERS / "broken" / "handler.py")},
            "model.safetensors not found",
        ),
    ],
)
def test_a_bad_setting_or_handler_stops_serve_before_fork(env, expected):
    result = run_serve({**env, "SERVING_BIND": env.get("SERVING_BIND", "127.0.0.1:0")})
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Booting worker" not in result.stderr + result.stdout
    if "SERVING_HANDLER" in env:
        assert Path(env["SERVING_HANDLER"]).name in result.stderr


@pytest.mark.parametrize(
    ("raw", "status", "type_"),
    [
        (b"GARBAGE\r\n\r\n", 400, "bad_request"),
        (
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
            431,
            "request_header_fields_too_large",
        ),
    ],
)
def test_requests_gunicorn_refuses_itself_get_json_errors(probe_server, raw, status, type_):
    host, port = probe_server.bind.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.split()[1] == str(status).encode()
    assert b"Content-Type: application/json" in head
    error = json.loads(body)["error"]
    assert error["message"]
    assert error["type"] == type_
