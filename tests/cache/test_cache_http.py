"""The inference cache behind /predict: real gunicorn workers, a real Redis, and a batch
run warming the cache for the online service."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serving_core.cache.cache import from_settings
from serving_core.loading import load_handler
from serving_core.settings import Settings
from tests.conftest import PROBE
from tests.redis_server import redis_server
from tests.servers import ROOT, SERVING_CORE, base_env, gunicorn_server, wait_for

pytestmark = pytest.mark.e2e
HEADER = {"SERVING_CACHE_HEADER": "true"}  # X-Cache is off by default


def calls(seen_file):
    """How many items reached the probe handler's predict_batch (it appends one line each)."""
    return len(seen_file.read_text().splitlines()) if seen_file.exists() else 0


def metric(url, name):
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_repeated_request_is_a_hit_that_does_not_call_the_handler(store, tmp_path):
    seen = tmp_path / "seen.txt"
    env = {**HEADER, "SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1", "PROBE_SEEN_FILE": str(seen)}
    with redis_server() if store == "redis" else contextlib.nullcontext("") as url:
        if url:
            env["SERVING_CACHE_URL"] = url
        with gunicorn_server(env) as server:
            body = {"text": "twice", "id": "a"}
            first = requests.post(server.url + "/predict", json=body, timeout=10)
            second = requests.post(server.url + "/predict", json=body, timeout=10)
            other = requests.post(server.url + "/predict", json={"text": "else"}, timeout=10)
            hits = metric(server.url, 'serving_cache_requests_total{result="hit"}')
    assert first.headers["X-Cache"] == "miss"
    assert second.headers["X-Cache"] == "hit"
    assert other.headers["X-Cache"] == "miss"
    assert second.content == first.content  # the same bytes, not only the same JSON
    assert calls(seen) == 3  # the warm-up, the miss and the other: the hit ran nothing
    assert hits == 1


def read_answers(sock: socket.socket, count: int) -> list[int]:
    """The statuses of the next ``count`` HTTP/1.1 answers on ``sock`` (Content-Length bodies)."""
    statuses, buffer = [], b""
    while len(statuses) < count:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            buffer += chunk
            continue
        head = buffer[:end].decode("latin-1").lower()
        length = int(head.split("content-length:")[1].split("\r\n")[0])
        if len(buffer) < end + 4 + length:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            buffer += chunk
            continue
        statuses.append(int(head[9:12]))
        buffer = buffer[end + 4 + length :]
    return statuses


def test_a_client_pipelining_cache_hits_does_not_keep_the_worker_from_the_others():
    # A cache hit never waits, and pipelined requests are already read: nothing in
    # the greenlet yields. The worker must still turn to the other connection
    # between two of this one's requests, or that connection waits for all of them.
    burst = 300

    def request(request_id: str) -> bytes:
        return (
            b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"X-Request-ID: " + request_id.encode() + b"\r\n"
            b'Content-Length: 16\r\n\r\n{"text": "same"}'
        )

    env = {"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1"}
    with gunicorn_server(env) as server:
        host, port = server.bind.split(":")
        hog, other = (socket.create_connection((host, int(port)), timeout=10) for _ in range(2))
        with hog, other:
            for sock in (hog, other):  # the answer is cached, and both greenlets exist
                sock.sendall(request("warm"))
                assert read_answers(sock, 1) == [200]
            hog.sendall(b"".join(request(f"hog-{i}") for i in range(burst)))
            other.sendall(request("other"))
            assert read_answers(other, 1) == [200]
            assert read_answers(hog, burst) == [200] * burst

        # The access log is in the order the worker answered; its last line may be
        # written just after the client read the last answer.
        def answered() -> list[str]:
            return [
                line.split("request_id=")[1]
                for line in server.output().splitlines()
                if "request_id=hog-" in line or "request_id=other" in line
            ]

        wait_for(lambda: len(answered()) >= burst + 1, f"{burst + 1} access log lines")
        order = answered()
    assert len(order) == burst + 1
    # Without the turn-taking, the other came after the whole burst.
    assert order.index("other") < burst // 2


def test_sixteen_concurrent_identical_requests_call_the_handler_once(tmp_path):
    seen = tmp_path / "seen.txt"
    env = {**HEADER, "SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1", "PROBE_SEEN_FILE": str(seen)}
    with gunicorn_server(env) as server:
        before = calls(seen)  # the warm-up
        barrier = threading.Barrier(16)

        def client(_):
            barrier.wait()
            body = {"text": "same", "sleep_s": 0.3}
            return requests.post(server.url + "/predict", json=body, timeout=30)

        with ThreadPoolExecutor(16) as pool:
            responses = list(pool.map(client, range(16)))
    assert {r.status_code for r in responses} == {200}
    assert calls(seen) - before == 1
    served = sorted(r.headers["X-Cache"] for r in responses)
    assert served.count("miss") == 1
    assert set(served) <= {"miss", "coalesced", "hit"}
    assert len({r.content for r in responses}) == 1


def test_two_workers_share_hits_through_redis(tmp_path):
    seen = tmp_path / "seen.txt"
    with redis_server() as url:
        env = {
            **HEADER,
            "SERVING_HANDLER": PROBE,
            "SERVING_WORKERS": "2",
            "SERVING_CACHE_URL": url,
            "PROBE_SEEN_FILE": str(seen),
        }
        with gunicorn_server(env) as server:
            body = {"text": "shared"}
            first = requests.post(server.url + "/predict", json=body, timeout=10)
            # A keep-alive connection to the other worker: new connections, each with a
            # request of its own (a miss shows who answered), until the other pid shows.
            for n in range(100):
                session = requests.Session()
                probe = session.post(server.url + "/predict", json={"text": f"p{n}"}, timeout=10)
                if probe.json()["pid"] != first.json()["pid"]:
                    break
                session.close()
            else:
                pytest.fail("the second worker never answered")
            # The same connection, so the same (other) worker: it answers from Redis.
            again = session.post(server.url + "/predict", json=body, timeout=10)
            session.close()
            log = server.output()
    # redis imported ssl before the workers' patch: no worker warns of it (REVIEW).
    assert "MonkeyPatchWarning" not in log, log[-3000:]
    assert first.headers["X-Cache"] == "miss"
    assert again.headers["X-Cache"] == "hit"
    assert again.content == first.content  # the first worker's output, pid and all


def test_with_redis_stopped_mid_test_requests_still_succeed_as_counted_misses():
    redis = redis_server()
    url = redis.__enter__()
    try:
        env = {**HEADER, "SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1", "SERVING_CACHE_URL": url}
        with gunicorn_server(env) as server:
            body = {"text": "before"}
            requests.post(server.url + "/predict", json=body, timeout=10)
            hit = requests.post(server.url + "/predict", json=body, timeout=10)
            redis.__exit__(None, None, None)  # Redis goes away under the running server
            redis = None
            responses = [
                requests.post(server.url + "/predict", json={"text": "after"}, timeout=10)
                for _ in range(3)
            ]
            errors = metric(server.url, "serving_cache_errors_total")
    finally:
        if redis is not None:
            redis.__exit__(None, None, None)
    assert hit.headers["X-Cache"] == "hit"
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert {r.headers["X-Cache"] for r in responses} == {"miss"}
    assert errors >= 1


def test_a_batch_run_with_warm_cache_makes_the_first_online_request_a_hit(tmp_path):
    seen = tmp_path / "seen.txt"
    records = tmp_path / "in.jsonl"
    records.write_text(
        "".join(json.dumps({"id": f"r{n}", "text": f"warm {n}"}) + "\n" for n in range(5))
    )
    out = ["--output", str(tmp_path / "out.jsonl"), "--warm-cache", "--workers", "1"]
    with redis_server() as url:
        batch = subprocess.run(
            [str(SERVING_CORE), "batch", "--input", str(records), *out],
            cwd=ROOT,
            env=base_env({"SERVING_HANDLER": PROBE, "SERVING_CACHE_URL": url}),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert batch.returncode == 0, batch.stderr
        env = {
            **HEADER,
            "SERVING_HANDLER": PROBE,
            "SERVING_WORKERS": "1",
            "SERVING_CACHE_URL": url,
            "PROBE_SEEN_FILE": str(seen),
        }
        with gunicorn_server(env) as server:
            before = calls(seen)
            warmed = requests.post(server.url + "/predict", json={"text": "warm 3"}, timeout=10)
            cold = requests.post(server.url + "/predict", json={"text": "cold"}, timeout=10)
            after = calls(seen)
    assert warmed.headers["X-Cache"] == "hit"
    assert warmed.json()["text"] == "warm 3"
    assert cold.headers["X-Cache"] == "miss"
    assert after - before == 1  # only the cold one ran


KEY_A, KEY_B = "tenant-a-key-0123456789", "tenant-b-key-0123456789"


def test_two_api_keys_share_no_cache_entry_and_no_one_is_told_x_cache(tmp_path):
    seen = tmp_path / "seen.txt"
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "1",
        "PROBE_SEEN_FILE": str(seen),
        "SERVING_API_KEYS": f"{KEY_A},{KEY_B}",
        "SERVING_CORS_ORIGINS": "https://app.example",
    }
    with redis_server() as url, gunicorn_server({**env, "SERVING_CACHE_URL": url}) as server:

        def ask(key):
            headers = {"X-API-Key": key, "Origin": "https://app.example"}
            body = {"text": "private", "id": "same"}
            return requests.post(server.url + "/predict", json=body, headers=headers, timeout=10)

        before = calls(seen)
        first_a, again_a = ask(KEY_A), ask(KEY_A)
        after_a = calls(seen)
        first_b = ask(KEY_B)
        after_b = calls(seen)
    assert [r.status_code for r in (first_a, again_a, first_b)] == [200, 200, 200]
    assert after_a - before == 1  # A's second request was A's own hit
    assert after_b - after_a == 1  # B computed: A's entry is not B's
    assert not [r for r in (first_a, again_a, first_b) if "X-Cache" in r.headers]
    exposed = first_a.headers["Access-Control-Expose-Headers"]
    assert "X-Request-ID" in exposed
    assert "X-Cache" not in exposed


GATED = """
import os
import time
from pathlib import Path

from serving_core import Handler


class Gated(Handler):
    name = "gated"
    input_schema = {"type": "object", "properties": {"text": {"type": "string"}}}

    def predict(self, item):
        gate = Path(os.environ["GATE_DIR"])
        with open(gate / "started", "a") as file:
            file.write(item["text"] + "\\n")
        while not (gate / "open").exists():
            time.sleep(0.01)
        return {"text": item["text"]}
"""


def test_a_leaders_deadline_does_not_fail_its_followers_and_a_hit_is_validated(tmp_path):
    (tmp_path / "gated").mkdir()
    (tmp_path / "gated" / "handler.py").write_text(GATED)
    started = tmp_path / "started"

    def models_started():
        return started.read_text().split() if started.exists() else []

    env = {
        **HEADER,
        "SERVING_HANDLER": str(tmp_path / "gated"),
        "SERVING_WORKERS": "1",
        "GATE_DIR": str(tmp_path),
    }
    with redis_server() as url, gunicorn_server({**env, "SERVING_CACHE_URL": url}) as server:
        predict = server.url + "/predict"
        with ThreadPoolExecutor(2) as pool:
            leader = pool.submit(
                requests.post,
                predict,
                json={"text": "same"},
                headers={"X-Request-Timeout": "1"},
                timeout=30,
            )
            wait_for(models_started, "the leader in the model")
            follower = pool.submit(requests.post, predict, json={"text": "same"}, timeout=30)
            wait_for(
                lambda: metric(server.url, 'serving_cache_requests_total{result="coalesced"}'),
                "the follower waiting on the leader",
            )
            assert leader.result().status_code == 504  # its own X-Request-Timeout
            (tmp_path / "open").touch()
            answer = follower.result()
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Cache"] == "miss"  # it computed again, itself
        assert models_started() == ["same", "same"]

        # An entry for parameters the schema refuses (another build's, say) is never
        # served: the hit gets the miss's 400.
        invalid = {"text": 5}
        miss = requests.post(predict, json=invalid, timeout=10)
        cache = from_settings(Settings(cache_url=url), load_handler(env["SERVING_HANDLER"]).handler)
        cache.fill(cache.key_for(invalid), {"text": "from another build"})
        hit = requests.post(predict, json=invalid, timeout=10)
    assert miss.status_code == hit.status_code == 400
    assert miss.json()["error"] == hit.json()["error"]
