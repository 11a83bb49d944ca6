"""A client that hangs up while its request waits takes the request out of the queue."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import PROBE
from tests.servers import gunicorn_server, wait_for

pytestmark = pytest.mark.e2e
WAIT_S = 30.0  # a bound on waiting for an event, never an expected time


def post_and_keep(host: str, port: int, params: dict[str, str]) -> socket.socket:
    """Send POST /predict on a connection of its own and leave it open, unanswered."""
    body = json.dumps(params).encode()
    client = socket.create_connection((host, port))
    client.sendall(
        b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    return client


def queue_depth(url: str) -> int:
    metadata = requests.get(url + "/metadata", timeout=WAIT_S).json()
    return int(metadata["batching"]["queue_depth"])


def test_the_requests_of_clients_that_hung_up_leave_the_queue_and_never_run(tmp_path):
    seen = tmp_path / "seen.txt"
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "1",
        "SERVING_CACHE_SIZE": "0",
        "SERVING_MAX_BATCH_SIZE": "4",
        "SERVING_MAX_QUEUE": "8",
        "SERVING_REQUEST_TIMEOUT_S": "30",
        "PROBE_SEEN_FILE": str(seen),
    }
    gate = tmp_path / "gate"
    gate.mkdir()
    with gunicorn_server(env) as server:
        host, port = server.bind.rsplit(":", 1)
        with ThreadPoolExecutor(2) as pool:
            # The model is busy with this one, until the gate opens, while the rest
            # queue behind it.
            hold = pool.submit(
                requests.post,
                server.url + "/predict",
                json={"id": "hold", "gate": str(gate)},
                timeout=WAIT_S,
            )
            try:
                wait_for((gate / "started").exists, "hold in the model", WAIT_S)
                clients = []
                for i in range(8):
                    clients.append(post_and_keep(host, int(port), {"id": f"gone-{i}"}))
                wait_for(lambda: queue_depth(server.url) == 8, "the gone requests queued", WAIT_S)
                full = requests.post(
                    server.url + "/predict", json={"id": "refused"}, timeout=WAIT_S
                )
                assert full.status_code == 503  # the queue is full of them
                for client in clients:
                    client.close()
                clients.clear()
                # They leave the queue while the model is still busy with hold.
                wait_for(lambda: queue_depth(server.url) == 0, "the gone requests gone", WAIT_S)
                # Hung up, but still in the queue until room is needed: a newcomer is
                # admitted (they are swept out first), not refused for a full queue.
                newcomer = pool.submit(
                    requests.post, server.url + "/predict", json={"id": "newcomer"}, timeout=WAIT_S
                )
                while queue_depth(server.url) < 1:  # the newcomer waits behind hold
                    assert not newcomer.done(), newcomer.result().text  # refused
                    time.sleep(0.02)
            finally:
                (gate / "open").touch()
            assert hold.result().status_code == 200
            assert newcomer.result().status_code == 200, newcomer.result().text
        after = requests.post(server.url + "/predict", json={"id": "after"}, timeout=WAIT_S)
        assert after.status_code == 200
    ran = seen.read_text().split()
    assert "after" in ran
    assert "newcomer" in ran
    assert not [i for i in ran if i.startswith("gone-")], ran


def test_a_request_others_wait_on_through_the_cache_stays_when_its_client_hangs_up(tmp_path):
    env = {
        "SERVING_CACHE_HEADER": "true",
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "1",
        "SERVING_REQUEST_TIMEOUT_S": "30",
    }
    with gunicorn_server(env) as server:
        host, port = server.bind.rsplit(":", 1)
        with ThreadPoolExecutor(2) as pool:
            hold = pool.submit(
                requests.post,
                server.url + "/predict",
                json={"id": "hold", "sleep_s": 3},
                timeout=WAIT_S,
            )
            time.sleep(0.5)  # hold is in the model (see above)
            leader = post_and_keep(host, int(port), {"id": "same"})
            deadline = time.monotonic() + WAIT_S
            while queue_depth(server.url) < 1:
                assert time.monotonic() < deadline, "the leader never queued"
                time.sleep(0.02)
            # An identical request waits on the leader's call (the inference cache).
            follower = pool.submit(
                requests.post, server.url + "/predict", json={"id": "same"}, timeout=WAIT_S
            )
            time.sleep(0.3)
            leader.close()
            answer = follower.result()
            assert hold.result().status_code == 200
        assert answer.status_code == 200, answer.text
        assert answer.headers.get("X-Cache") == "coalesced"
