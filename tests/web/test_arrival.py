from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serving_core.web import arrival
from tests.conftest import PROBE, make_app
from tests.servers import gunicorn_server

NOW, WALL = 1000.0, 1_700_000_000.0


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("t=1699999999.750", 999.75),
        ("1699999999.750", 999.75),
        ("t=1699999999750", 999.75),  # milliseconds
        ("t=1699999999750000", 999.75),  # microseconds
        ("t=1700000005.0", None),  # from the future: clock skew
        ("t=soon", None),
        ("", None),
        (None, None),
    ],
)
def test_x_request_start_is_read_in_the_usual_units(header, expected):
    result = arrival.from_header(header, now=NOW, wall_now=WALL)
    assert result == (None if expected is None else pytest.approx(expected))


def test_the_earliest_stamp_is_the_arrival():
    arrival.set_queued_at(999.9)
    try:
        assert arrival.arrival("t=1699999999.5", now=NOW, wall_now=WALL) == pytest.approx(999.5)
        assert arrival.arrival(None, now=NOW, wall_now=WALL) == 999.9
    finally:
        arrival.set_queued_at(None)
    assert arrival.arrival(None, now=NOW, wall_now=WALL) == NOW


def test_a_request_that_waited_past_its_deadline_upstream_is_a_504_without_running(client):
    stamp = f"t={time.time() - 20:.3f}"
    response = client.post("/predict", json={"id": "stale"}, headers={"X-Request-Start": stamp})
    assert response.status_code == 504
    assert "before reaching the app" in response.get_json()["error"]["message"]
    seen = client.post("/predict", json={"report": True}).get_json()["seen"]
    assert "stale" not in seen


@pytest.mark.parametrize(
    ("entries", "peer", "trusted"),
    [
        (["127.0.0.1", "::1"], "127.0.0.1", True),
        (["127.0.0.1", "::1"], "::1", True),
        (["127.0.0.1", "::1"], "203.0.113.7", False),
        (["127.0.0.1", "::1"], "", True),  # a unix socket's peer
        (["10.0.0.0/8"], "10.1.2.3", True),
        (["10.0.0.0/8"], "11.1.2.3", False),
        (["fd00::/8"], "fd12::1", True),
        (["*"], "198.51.100.1", True),
        ([], "127.0.0.1", False),
        (["127.0.0.1"], "not an address", False),
    ],
)
def test_trusted_proxies(entries, peer, trusted):
    assert arrival.TrustedProxies(entries).trusts(peer) is trusted


def stale_request(app, peer: str):
    stamp = f"t={time.time() - 20:.3f}"  # past the 10 s deadline, were it believed
    return app.test_client().post(
        "/predict",
        json={"text": "hi"},
        headers={"X-Request-Start": stamp},
        environ_base={"REMOTE_ADDR": peer},
    )


def test_x_request_start_from_an_untrusted_peer_is_ignored(app):
    assert stale_request(app, "203.0.113.7").status_code == 200
    assert stale_request(app, "127.0.0.1").status_code == 504


def test_x_request_start_is_believed_from_a_configured_proxy():
    app = make_app(max_wait_ms=1, trusted_proxies="203.0.113.0/24")
    app.extensions["serving_core"].start()
    try:
        assert stale_request(app, "203.0.113.7").status_code == 504
        assert stale_request(app, "127.0.0.1").status_code == 200  # no longer the default
        assert stale_request(app, "").status_code == 504  # a unix socket
    finally:
        app.extensions["serving_core"].stop()


def test_the_deadline_counts_from_the_proxy_stamp(client):
    stamp = f"t={time.time() - 0.4:.3f}"
    response = client.post(
        "/predict",
        json={"sleep_s": 0.3},
        headers={"X-Request-Start": stamp, "X-Request-Timeout": "0.5"},
    )
    assert response.status_code == 504


@pytest.mark.e2e
def test_time_spent_waiting_for_a_gunicorn_thread_counts_against_the_deadline(tmp_path):
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKER_CLASS": "gthread",
        "SERVING_WORKERS": "1",
        "SERVING_THREADS": "1",
        "SERVING_REQUEST_TIMEOUT_S": "5",
        "PROBE_SEEN_FILE": str(tmp_path / "seen"),
    }
    with gunicorn_server(env) as server, ThreadPoolExecutor(2) as pool:
        busy = pool.submit(
            requests.post, server.url + "/predict", json={"id": "busy", "sleep_s": 1.0}
        )
        time.sleep(0.1)
        # The only thread is busy for 1 s: this request waits inside gunicorn, unseen by
        # the app, longer than the 0.5 s it allows itself.
        waited = requests.post(
            server.url + "/predict",
            json={"id": "waited"},
            headers={"X-Request-Timeout": "0.5"},
            timeout=10,
        )
        assert busy.result().status_code == 200
    assert waited.status_code == 504
    assert "before reaching the app" in waited.json()["error"]["message"]
    assert "waited" not in (tmp_path / "seen").read_text().split()
