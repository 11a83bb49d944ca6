"""nginx in front of gunicorn: the configuration the container ships, run by Debian's nginx.

The e2e tests start a real ``serving-core serve`` and a real nginx started by
the image's own entrypoint (``nginx/entrypoint.sh``, which checks the settings
and renders ``nginx/templates`` before it execs nginx), on 127.0.0.1, and stop
both by PID when they end.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.container.dockerfile import parse
from tests.nginx_server import (
    NGINX,
    TEMPLATES,
    Nginx,
    RenderError,
    nginx_server,
    nginx_t,
    render,
    wait_until_ready,
)
from tests.servers import ROOT, Server, free_port, git_ls_files, gunicorn_server, wait_for

ECHO = "handlers/echo/handler.py"
SLOW = "tests/handlers/nginx_slow/handler.py"
# The limits both processes read, as the compose file and the chart share them.
LIMITS = {
    "SERVING_MAX_BODY_BYTES": "4096",
    "SERVING_REQUEST_TIMEOUT_S": "10",
    "SERVING_KEEPALIVE_S": "5",
}
GENERATED_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass
class Stack:
    app: Server
    nginx: Nginx

    def app_saw(self, request_id: str, timeout_s: float = 5.0) -> bool:
        """Whether the app logged ``request_id`` (its access line follows the response)."""
        deadline = time.monotonic() + timeout_s
        while request_id not in self.app.output():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True


def queue_depth(app: Server) -> int:
    """Requests waiting for the model thread of ``app``'s one worker."""
    depth: int = requests.get(app.url + "/metadata", timeout=5).json()["batching"]["queue_depth"]
    return depth


@pytest.fixture(scope="module")
def echo_stack() -> Iterator[Stack]:
    app_env = {"SERVING_HANDLER": ECHO, "SERVING_WORKERS": "2", **LIMITS}
    with gunicorn_server(app_env) as app, nginx_server(app.bind, LIMITS) as proxy:
        yield Stack(app, proxy)


def error_of(response: requests.Response) -> dict[str, str]:
    """The ``error`` object of a JSON error response, checking the shape on the way."""
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert isinstance(body["error"]["type"], str)
    assert isinstance(body["error"]["message"], str)
    return body["error"]


def json_body_of_size(size: int) -> bytes:
    body = b'{"text": "' + b"a" * (size - len(b'{"text": ""}')) + b'"}'
    assert len(body) == size
    return body


# -- predictions and limits ----------------------------------------------------


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_a_prediction_passes_through_nginx(echo_stack: Stack) -> None:
    response = requests.post(
        echo_stack.nginx.url + "/predict", json={"text": "hello", "n": 3}, timeout=10
    )
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json() == {"echo": {"text": "hello", "n": 3}}
    request_id = response.headers["X-Request-ID"]
    entry = echo_stack.nginx.access_entry(request_id)
    assert (entry["status"], entry["upstream_status"]) == (200, "200")


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_the_apps_other_endpoints_pass_through_nginx(echo_stack: Stack) -> None:
    assert requests.get(echo_stack.nginx.url + "/healthz", timeout=5).status_code == 200
    assert requests.get(echo_stack.nginx.url + "/readyz", timeout=5).status_code == 200
    missing = requests.get(echo_stack.nginx.url + "/no-such-route", timeout=5)
    assert missing.status_code == 404
    assert error_of(missing)["type"] == "not_found"  # the app's 404, not nginx's


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_metrics_are_kept_off_the_api_port(echo_stack: Stack) -> None:
    response = requests.get(echo_stack.nginx.url + "/metrics", timeout=5)
    assert response.status_code == 404
    error = error_of(response)
    assert error["type"] == "not_found"
    assert "NGINX_METRICS_PORT" in error["message"]  # nginx's 404, the app was not asked


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_the_metrics_port_serves_the_apps_metrics_and_nothing_else(echo_stack: Stack) -> None:
    direct = requests.get(echo_stack.app.url + "/metrics", timeout=5)
    proxied = requests.get(echo_stack.nginx.metrics_url + "/metrics", timeout=5)
    assert proxied.status_code == direct.status_code
    assert proxied.headers["Content-Type"] == direct.headers["Content-Type"]
    other = requests.post(echo_stack.nginx.metrics_url + "/predict", timeout=5)
    assert other.status_code == 404
    assert error_of(other)["type"] == "not_found"
    # No route here takes a body: one is refused before it is read.
    for path in ("/predict", "/metrics"):
        body = requests.post(echo_stack.nginx.metrics_url + path, data=b"x" * 4096, timeout=5)
        assert body.status_code == 413
        assert error_of(body)["type"] == "payload_too_large"
    health = requests.get(echo_stack.nginx.metrics_url + "/_nginx/healthz", timeout=5)
    assert health.status_code == 200
    # The app's /readyz, for the chart's readiness probe; /healthz stays off it.
    ready = requests.get(echo_stack.nginx.metrics_url + "/readyz", timeout=5)
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    alive = requests.get(echo_stack.nginx.metrics_url + "/healthz", timeout=5)
    assert alive.status_code == 404


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_a_body_exactly_at_the_limit_reaches_the_app(echo_stack: Stack) -> None:
    body = json_body_of_size(4096)
    response = requests.post(
        echo_stack.nginx.url + "/predict",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 200
    assert response.json()["echo"]["text"] == "a" * (4096 - 12)


@pytest.mark.example("echo")
@pytest.mark.e2e
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_over_the_limit_is_refused_by_nginx_with_json_413(
    echo_stack: Stack, framing: str
) -> None:
    body = json_body_of_size(4097)
    request_id = f"too-large-{framing}"
    response = requests.post(
        echo_stack.nginx.url + "/predict",
        data=body if framing == "content-length" else iter([body[:2000], body[2000:]]),
        headers={"Content-Type": "application/json", "X-Request-ID": request_id},
        timeout=10,
    )
    assert response.status_code == 413
    error = error_of(response)
    assert error["type"] == "payload_too_large"
    assert "4096 bytes (SERVING_MAX_BODY_BYTES)" in error["message"]  # nginx's wording
    assert response.headers["X-Request-ID"] == request_id
    entry = echo_stack.nginx.access_entry(request_id)
    assert entry["upstream_addr"] == ""  # nginx never opened a connection to gunicorn
    assert not echo_stack.app_saw(request_id, timeout_s=0.5)


# -- request ids and the access log ------------------------------------------------


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_a_clients_request_id_reaches_the_app_log_and_comes_back(echo_stack: Stack) -> None:
    request_id = "client-7f3a/2024:01+x=y"
    response = requests.post(
        echo_stack.nginx.url + "/predict",
        json={"text": "id"},
        headers={"X-Request-ID": request_id},
        timeout=10,
    )
    assert response.status_code == 200
    assert response.headers["X-Request-ID"] == request_id
    # One header, not nginx's and the app's both.
    assert response.raw.headers.getlist("X-Request-ID") == [request_id]
    assert echo_stack.app_saw(request_id)
    assert echo_stack.nginx.access_entry(request_id)["uri"] == "/predict"


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_nginx_generates_the_request_id_the_app_logs_when_the_client_sends_none(
    echo_stack: Stack,
) -> None:
    response = requests.post(echo_stack.nginx.url + "/predict", json={"text": "x"}, timeout=10)
    request_id = response.headers["X-Request-ID"]
    assert GENERATED_ID.match(request_id)
    assert echo_stack.app_saw(request_id)  # nginx's id, not one the app made up
    assert echo_stack.nginx.access_entry(request_id)["status"] == 200


@pytest.mark.example("echo")
@pytest.mark.e2e
@pytest.mark.parametrize("sent", ["has spaces", "x" * 129, "semi;colon", 'quote"d'])
def test_a_request_id_the_app_would_reject_is_replaced_by_nginx(
    echo_stack: Stack, sent: str
) -> None:
    response = requests.post(
        echo_stack.nginx.url + "/predict",
        json={"text": "x"},
        headers={"X-Request-ID": sent},
        timeout=10,
    )
    request_id = response.headers["X-Request-ID"]
    assert request_id != sent
    assert GENERATED_ID.match(request_id)
    assert echo_stack.app_saw(request_id)


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_the_access_log_is_one_json_object_per_request(echo_stack: Stack) -> None:
    response = requests.post(
        echo_stack.nginx.url + "/predict?lang=en",
        json={"text": "log me"},
        headers={"User-Agent": 'agent "quoted" \\ back'},
        timeout=10,
    )
    entry = echo_stack.nginx.access_entry(response.headers["X-Request-ID"])
    assert entry["method"] == "POST"
    assert entry["uri"] == "/predict?lang=en"
    assert entry["status"] == 200
    assert entry["user_agent"] == 'agent "quoted" \\ back'  # escaped, still valid JSON
    assert isinstance(entry["request_time"], float)
    assert entry["upstream_addr"] == echo_stack.app.bind


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_neither_access_log_holds_a_job_id_in_full(echo_stack: Stack) -> None:
    posted = requests.post(echo_stack.nginx.url + "/jobs", json={"text": "later"}, timeout=10)
    assert posted.status_code == 202
    job_id = posted.json()["job_id"]
    read = requests.get(
        echo_stack.nginx.url + f"/jobs/{job_id}?wait=0",
        headers={"X-Request-ID": "job-read"},
        timeout=10,
    )
    assert read.json()["job_id"] == job_id
    entry = echo_stack.nginx.access_entry("job-read")
    assert entry["uri"] == f"/jobs/{job_id[:8]}...?wait=0"
    assert echo_stack.app_saw("job-read")
    logs = echo_stack.app.output() + echo_stack.nginx.access_log.read_text()
    assert f"/jobs/{job_id[:8]}..." in logs
    assert job_id[8:] not in logs


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_the_kubelets_probes_are_left_out_of_the_access_log(echo_stack: Stack) -> None:
    # One connection, so one nginx worker logs both, the probe first.
    with requests.Session() as session:
        probe = session.get(
            echo_stack.nginx.url + "/healthz",
            headers={"User-Agent": "kube-probe/1.33", "X-Request-ID": "probe"},
            timeout=5,
        )
        after = session.get(
            echo_stack.nginx.url + "/healthz", headers={"X-Request-ID": "after-probe"}, timeout=5
        )
    assert (probe.status_code, after.status_code) == (200, 200)
    echo_stack.nginx.access_entry("after-probe")
    assert not [e for e in echo_stack.nginx.access_entries() if e["request_id"] == "probe"]


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_nginx_stamps_x_request_start_over_the_clients(echo_stack: Stack) -> None:
    # The app counts a request's deadline from X-Request-Start. A stamp a minute
    # old is past the 10 s deadline straight to the app; nginx replaces it.
    forged = {"X-Request-Start": f"t={time.time() - 60:.3f}"}
    direct = requests.post(echo_stack.app.url + "/predict", json={}, headers=forged, timeout=10)
    assert direct.status_code in (503, 504)
    proxied = requests.post(echo_stack.nginx.url + "/predict", json={}, headers=forged, timeout=10)
    assert proxied.status_code == 200


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_nginx_reuses_its_connections_to_gunicorn(echo_stack: Stack) -> None:
    app_port = int(echo_stack.app.bind.rpartition(":")[2])

    def upstream_connections() -> set[int]:
        """Local ports of ESTABLISHED connections to gunicorn: nginx's side of them."""
        ports = set()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(remote.split(":")[1], 16) == app_port:
                ports.add(int(local.split(":")[1], 16))
        return ports

    for _ in range(10):
        assert requests.post(echo_stack.nginx.url + "/predict", json={}, timeout=10).ok
    first = upstream_connections()
    for _ in range(10):
        assert requests.post(echo_stack.nginx.url + "/predict", json={}, timeout=10).ok
    # Twenty requests, each on a new client connection, rode at most one kept-alive
    # upstream connection per nginx worker (NGINX_WORKER_PROCESSES=2).
    assert first, "no idle keep-alive connection to gunicorn after 10 requests"
    assert len(first | upstream_connections()) <= 2


# -- errors: nginx's own, and the app's passed through ------------------------------


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_nginx_answers_json_502_once_the_app_is_down() -> None:
    app_port = free_port()
    upstream = f"127.0.0.1:{app_port}"
    with nginx_server(upstream, LIMITS) as proxy:
        with gunicorn_server({"SERVING_HANDLER": ECHO, "SERVING_BIND": upstream, **LIMITS}):
            up = requests.post(proxy.url + "/predict", json={"text": "up"}, timeout=10)
            assert up.status_code == 200
        response = requests.post(
            proxy.url + "/predict",
            json={"text": "down"},
            headers={"X-Request-ID": "app-is-down"},
            timeout=10,
        )
    assert response.status_code == 502
    assert error_of(response)["type"] == "bad_gateway"
    assert response.headers["X-Request-ID"] == "app-is-down"


# Holds the model thread until the test lets it go: "started" is touched when the
# request reaches the model, which then waits for "release" to exist. Written
# into a temporary folder by the test that needs it.
GATE_HANDLER = """
import time
from pathlib import Path

from serving_core import Handler


class Gate(Handler):
    name = "nginx-gate"

    def predict(self, params):
        if "started" in params:
            Path(params["started"]).touch()
            while not Path(params["release"]).exists():
                time.sleep(0.01)
        return {"done": True}
"""


def post_through(proxy: Nginx, params: dict[str, str], request_id: str) -> requests.Response:
    return requests.post(
        proxy.url + "/predict", json=params, headers={"X-Request-ID": request_id}, timeout=20
    )


def third_while_two_are_held(
    app: Server, proxy: Nginx, gate_dir: Path, while_held: Callable[[], None] = lambda: None
) -> requests.Response:
    """With GATE_HANDLER serving one request at a time: one request held in the model,
    one queued behind it, then a third, answered (and ``while_held`` run) before the
    gate opens; the two held ones must then succeed."""
    started, release = gate_dir / "started", gate_dir / "release"
    with ThreadPoolExecutor(2) as pool:
        try:
            gate = {"started": str(started), "release": str(release)}
            running = pool.submit(post_through, proxy, gate, "running")
            wait_for(started.exists, "the first request to reach the model", timeout_s=15)
            # Different params: identical ones would share the first's model call.
            queued = pool.submit(post_through, proxy, {"who": "queued"}, "queued")
            wait_for(lambda: queue_depth(app) == 1, "the second request to be queued", timeout_s=15)
            # Answered while the gate still holds both: refused at once, not queued
            # behind them (it would wait for the release below).
            refused = post_through(proxy, {"who": "refused"}, "refused")
            while_held()
        finally:
            release.touch()
        assert running.result().status_code == 200
        assert queued.result().status_code == 200
    return refused


@pytest.mark.e2e
def test_the_apps_503_and_retry_after_pass_through_unchanged(tmp_path: Path) -> None:
    (tmp_path / "handler.py").write_text(GATE_HANDLER)
    app_env = {
        "SERVING_HANDLER": str(tmp_path / "handler.py"),
        "SERVING_WORKERS": "1",
        "SERVING_THREADS": "4",
        "SERVING_MAX_BATCH_SIZE": "1",
        "SERVING_MAX_QUEUE": "1",  # the queue holds one: the third is the app's to refuse
        **LIMITS,
    }
    with gunicorn_server(app_env) as app, nginx_server(app.bind, LIMITS) as proxy:
        refused = third_while_two_are_held(app, proxy, tmp_path)

        assert refused.status_code == 503
        error = error_of(refused)
        assert error["type"] == "overloaded"  # the app's error, not nginx's
        assert "queue is full" in error["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.headers["X-Request-ID"] == "refused"
        entry = proxy.access_entry("refused")
        assert (entry["status"], entry["upstream_status"]) == (503, "503")


@pytest.mark.e2e
def test_past_the_upstream_max_conns_nginx_refuses_at_once_with_the_apps_503(
    tmp_path: Path,
) -> None:
    (tmp_path / "handler.py").write_text(GATE_HANDLER)
    # The app alone would queue 8 more: nginx's cap of 2 is what refuses the third.
    app_env = {
        "SERVING_HANDLER": str(tmp_path / "handler.py"),
        "SERVING_WORKERS": "1",
        "SERVING_THREADS": "16",
        "SERVING_MAX_BATCH_SIZE": "1",
        "SERVING_MAX_QUEUE": "8",
        **LIMITS,
    }
    nginx_env = {**LIMITS, "NGINX_UPSTREAM_MAX_CONNS": "2"}
    with gunicorn_server(app_env) as app, nginx_server(app.bind, nginx_env) as proxy:
        stack = Stack(app, proxy)
        scraped: list[requests.Response] = []
        # Prometheus still reaches the app's metrics through the full upstream,
        # and the kubelet's readiness probe its /readyz: a pod that sheds stays ready.
        refused = third_while_two_are_held(
            app,
            proxy,
            tmp_path,
            lambda: scraped.extend(
                requests.get(proxy.metrics_url + path, timeout=5)
                for path in ("/metrics", "/readyz")
            ),
        )
        # A slot freed: the next request reaches the app again.
        after = post_through(proxy, {"who": "after"}, "after")

        assert refused.status_code == 503
        error = error_of(refused)
        assert error["type"] == "overloaded"
        assert "NGINX_UPSTREAM_MAX_CONNS" in error["message"]
        assert refused.headers["Retry-After"] == "1"
        assert refused.headers["X-Request-ID"] == "refused"
        assert not stack.app_saw("refused", timeout_s=0.5)
        entry = proxy.access_entry("refused")
        # No connection to the app was made: nginx names the group, not an address.
        assert (entry["status"], entry["upstream_addr"]) == (503, "serving_core")
        assert [r.status_code for r in scraped] == [200, 200]
        assert scraped[1].json() == {"status": "ready"}  # the app's answer
        assert after.status_code == 200


@pytest.mark.e2e
def test_the_apps_504_passes_through_before_nginx_would_time_out() -> None:
    limits = {**LIMITS, "SERVING_REQUEST_TIMEOUT_S": "1"}
    app_env = {"SERVING_HANDLER": SLOW, "SERVING_WORKERS": "1", **limits}
    with gunicorn_server(app_env) as app, nginx_server(app.bind, limits) as proxy:
        response = requests.post(
            proxy.url + "/predict",
            json={"sleep_s": 2.5},
            headers={"X-Request-ID": "too-slow"},
            timeout=20,
        )
        entry = proxy.access_entry("too-slow")
    assert response.status_code == 504
    # The app's error, not nginx's gateway_timeout: its deadline (1 s) came first.
    assert error_of(response)["type"] == "deadline_exceeded"
    assert (entry["status"], entry["upstream_status"]) == (504, "504")


@pytest.mark.e2e
def test_nginx_answers_its_own_json_504_when_the_app_hangs_past_nginxs_timeout() -> None:
    # Deliberately misaligned: nginx expects a 0.5 s deadline, the app has 10 s.
    app_env = {"SERVING_HANDLER": SLOW, "SERVING_WORKERS": "1", **LIMITS}
    nginx_env = {**LIMITS, "SERVING_REQUEST_TIMEOUT_S": "0.5", "NGINX_TIMEOUT_MARGIN_S": "0.5"}
    with gunicorn_server(app_env) as app, nginx_server(app.bind, nginx_env) as proxy:
        response = requests.post(
            proxy.url + "/predict",
            json={"sleep_s": 3},
            headers={"X-Request-ID": "hung"},
            timeout=20,
        )
    assert response.status_code == 504
    error = error_of(response)
    assert error["type"] == "gateway_timeout"
    assert "1000ms" in error["message"]
    assert response.headers["X-Request-ID"] == "hung"


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_a_client_over_the_rate_limit_gets_json_429_with_retry_after() -> None:
    app_env = {"SERVING_HANDLER": ECHO, "SERVING_WORKERS": "1", **LIMITS}
    nginx_env = {**LIMITS, "NGINX_RATE_LIMIT_RPS": "1", "NGINX_RATE_LIMIT_BURST": "0"}
    with gunicorn_server(app_env) as app, nginx_server(app.bind, nginx_env) as proxy:
        stack = Stack(app, proxy)
        first = requests.post(proxy.url + "/predict", json={}, timeout=10)
        second = requests.post(
            proxy.url + "/predict", json={}, headers={"X-Request-ID": "limited"}, timeout=10
        )
        # nginx's own health check is outside the limit.
        health = requests.get(proxy.url + "/_nginx/healthz", timeout=5)
        assert first.status_code == 200
        assert second.status_code == 429
        error = error_of(second)
        assert error["type"] == "too_many_requests"
        assert "NGINX_RATE_LIMIT_RPS" in error["message"]
        assert second.headers["Retry-After"] == "1"
        assert second.headers["X-Request-ID"] == "limited"
        assert not stack.app_saw("limited", timeout_s=0.5)
        assert health.status_code == 200


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_the_tls_listener_serves_predictions(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    tls_port = free_port()
    tls = {"NGINX_TLS_CERT": str(cert), "NGINX_TLS_KEY": str(key), "NGINX_TLS_PORT": str(tls_port)}
    app_env = {"SERVING_HANDLER": ECHO, "SERVING_WORKERS": "1", **LIMITS}
    with gunicorn_server(app_env) as app, nginx_server(app.bind, {**LIMITS, **tls}):
        response = requests.post(
            f"https://127.0.0.1:{tls_port}/predict",
            json={"text": "secret"},
            verify=str(cert),
            timeout=10,
        )
    assert response.status_code == 200
    assert response.json() == {"echo": {"text": "secret"}}


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_nginx_reaches_gunicorn_over_a_unix_socket() -> None:
    # Not tmp_path: its parents are private to root, and nginx's workers run as
    # nobody when the tests run as root; they must reach the socket.
    with tempfile.TemporaryDirectory(prefix="serving-sock-") as tmp:
        Path(tmp).chmod(0o755)
        socket_path = Path(tmp) / "gunicorn.sock"
        app_env = {"SERVING_HANDLER": ECHO, "SERVING_BIND": f"unix:{socket_path}", **LIMITS}
        with gunicorn_server(app_env) as app, nginx_server(app.bind, LIMITS) as proxy:
            wait_until_ready(proxy.url)
            response = requests.post(proxy.url + "/predict", json={"text": "sock"}, timeout=10)
            entry = proxy.access_entry(response.headers["X-Request-ID"])
    assert response.status_code == 200
    assert response.json() == {"echo": {"text": "sock"}}
    assert entry["upstream_addr"] == f"unix:{socket_path}"


# -- who may call: headers, keys, connections per client --------------------------

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
API_KEY = "nginx-e2e-4d3c2b1a0f9e8d7c"


def assert_security_headers(response: requests.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.raw.headers.getlist(name) == [value], (name, response.status_code)
    # server_tokens off: nginx, with no version, and never gunicorn's banner.
    assert response.headers["Server"] == "nginx"


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_every_answer_carries_the_security_headers_and_no_version(echo_stack: Stack) -> None:
    url = echo_stack.nginx.url
    answers = [
        requests.post(url + "/predict", json={"text": "a"}, timeout=10),  # the app's 200
        requests.get(url + "/no-such-route", timeout=10),  # the app's 404
        requests.post(url + "/predict", data=json_body_of_size(4097), timeout=10),  # nginx's 413
        requests.get(url + "/metrics", timeout=10),  # nginx's own 404
        requests.get(url + "/_nginx/healthz", timeout=10),
    ]
    assert [a.status_code for a in answers] == [200, 404, 413, 404, 200]
    for answer in answers:
        assert_security_headers(answer)


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_keys_pass_through_nginx_and_no_log_holds_one() -> None:
    app_env = {"SERVING_HANDLER": ECHO, "SERVING_WORKERS": "1", "SERVING_API_KEYS": API_KEY}
    with gunicorn_server({**app_env, **LIMITS}) as app, nginx_server(app.bind, LIMITS) as proxy:
        refused = requests.post(proxy.url + "/predict", json={}, timeout=10)
        wrong = requests.post(
            proxy.url + "/predict", json={}, headers={"X-API-Key": API_KEY[::-1]}, timeout=10
        )
        passed = requests.post(
            proxy.url + "/predict",
            json={"text": "k"},
            headers={"Authorization": f"Bearer {API_KEY}", "X-Request-ID": "keyed"},
            timeout=10,
        )
        health = requests.get(proxy.url + "/readyz", timeout=10)
        proxy.access_entry("keyed")  # written: the log below is complete
        logs = app.output() + proxy.output() + proxy.access_log.read_text()
    assert (refused.status_code, wrong.status_code, passed.status_code) == (401, 401, 200)
    assert refused.headers["WWW-Authenticate"].startswith("Bearer")  # the app's, through nginx
    assert_security_headers(refused)
    assert health.status_code == 200
    assert API_KEY not in logs
    assert API_KEY[::-1] not in logs


def open_slow_upload(port: int) -> socket.socket:
    """A request whose headers are sent and whose body never finishes: it stays in progress."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    return sock


def status_within(url: str, status: int, timeout_s: float = 15.0) -> requests.Response:
    """Polls ``url`` until it answers ``status`` (the slow uploads are counted asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = requests.post(url, json={"text": "c"}, timeout=10)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.02)


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_a_client_over_its_connection_limit_gets_json_429_and_probes_still_answer() -> None:
    app_env = {"SERVING_HANDLER": ECHO, "SERVING_WORKERS": "1", **LIMITS}
    nginx_env = {**LIMITS, "NGINX_CONN_LIMIT_PER_CLIENT": "2", "NGINX_CLIENT_TIMEOUT_S": "60"}
    with gunicorn_server(app_env) as app, nginx_server(app.bind, nginx_env) as proxy:
        with contextlib.ExitStack() as uploads:
            for _ in range(2):
                uploads.enter_context(open_slow_upload(proxy.port))
            refused = status_within(proxy.url + "/predict", 429)
            health = requests.get(proxy.url + "/_nginx/healthz", timeout=5)
        # The slow uploads gone, the same client is served again.
        served = status_within(proxy.url + "/predict", 200)
    assert refused.status_code == 429
    error = error_of(refused)
    assert error["type"] == "too_many_requests"
    assert "NGINX_CONN_LIMIT_PER_CLIENT (2" in error["message"]
    assert refused.headers["Retry-After"] == "1"
    assert_security_headers(refused)
    assert health.status_code == 200  # nginx's own probe is outside the limit
    assert served.status_code == 200


# -- the rendered configuration ------------------------------------------------------

INCLUDE = re.compile(r"^\s*include\s+(\S+);", re.MULTILINE)
# A line only an nginx configuration has: a hand-kept copy of nginx.conf
# anywhere else in the repository (a chart ConfigMap, say) holds one.
NGINX_CONFIG_LINE = re.compile(r"^\s*(proxy_pass\s+\S+;|upstream\s+\w+\s*\{)", re.MULTILINE)
# The env the chart gives its nginx sidecar (helm/serving-core, "serving-core.nginxEnv"),
# with the chart's defaults; tests/deploy/test_chart_nginx.py renders the chart's own.
CHART_SIDECAR = {
    "NGINX_UPSTREAM": "unix:/run/serving/gunicorn.sock",
    "NGINX_PORT": "8080",
    "NGINX_METRICS_PORT": "9090",
    "SERVING_MAX_BODY_BYTES": "1048576",
    "SERVING_REQUEST_TIMEOUT_S": "10",
    "SERVING_KEEPALIVE_S": "5",
    "NGINX_UPSTREAM_KEEPALIVE": "32",
    "NGINX_WORKER_PROCESSES": "auto",
    "NGINX_WORKER_CONNECTIONS": "1024",
    "NGINX_CONN_LIMIT_PER_CLIENT": "128",
    "NGINX_BODY_SPOOL_BYTES": "128m",
    "NGINX_CLIENT_TIMEOUT_S": "10",
    "NGINX_KEEPALIVE_TIMEOUT_S": "15",
    "NGINX_RATE_LIMIT_RPS": "0",
    "NGINX_RATE_LIMIT_BURST": "20",
    "NGINX_LOG_LEVEL": "warn",
}


def as_nginx_reads_it(conf: Path) -> str:
    """``conf`` with every ``include`` replaced by the file it names, as nginx loads it."""
    return INCLUDE.sub(lambda m: as_nginx_reads_it(Path(m.group(1))), conf.read_text())


def rendered(tmp_path: Path, settings: dict[str, str]) -> str:
    base = {"NGINX_ACCESS_LOG": str(tmp_path / "access.log"), "NGINX_UPSTREAM": "127.0.0.1:9"}
    return as_nginx_reads_it(render({**base, **settings}, tmp_path / "conf"))


@pytest.mark.parametrize(
    ("settings", "directives"),
    [
        (
            {"NGINX_UPSTREAM": "app:8000"},
            [
                "server app:8000;",
                "listen 8080;",
                "client_max_body_size 1048576;",
                "proxy_read_timeout 15000ms;",  # the app's 10 s deadline + 5 s
                "proxy_send_timeout 15000ms;",
                "keepalive_timeout 4000ms;",  # under gunicorn's 5 s keep-alive
            ],
        ),
        (
            {
                "SERVING_MAX_BODY_BYTES": "65536",
                "SERVING_REQUEST_TIMEOUT_S": "2.5",
                "NGINX_TIMEOUT_MARGIN_S": "1",
                "SERVING_KEEPALIVE_S": "1.5",
                "NGINX_UPSTREAM": "unix:/run/serving/gunicorn.sock",
                "NGINX_LISTEN_ADDRESS": "::1",
            },
            [
                "server unix:/run/serving/gunicorn.sock;",
                "listen [::1]:8080;",
                "client_max_body_size 65536;",
                "proxy_read_timeout 3500ms;",
                "keepalive_timeout 750ms;",  # half of a keep-alive under 2 s
            ],
        ),
        (
            # A generating handler's one-piece answer takes up to its generation timeout.
            {"SERVING_REQUEST_TIMEOUT_S": "10", "SERVING_GENERATION_TIMEOUT_S": "120"},
            ["proxy_read_timeout 125000ms;", "proxy_send_timeout 125000ms;"],
        ),
    ],
)
def test_render_lines_nginx_up_with_the_apps_limits(
    tmp_path: Path, settings: dict[str, str], directives: list[str]
) -> None:
    conf = rendered(tmp_path, settings)
    for directive in directives:
        assert directive in conf
    assert "${" not in conf  # every placeholder was filled


def test_every_placeholder_in_every_template_is_filled(tmp_path: Path) -> None:
    conf_dir = render({"NGINX_UPSTREAM": "127.0.0.1:9"}, tmp_path).parent
    rendered_files = sorted(p.name for p in conf_dir.glob("*.conf"))
    assert rendered_files == sorted(p.name.removesuffix(".template") for p in TEMPLATES.iterdir())
    for path in conf_dir.glob("*.conf"):
        assert "${" not in path.read_text(), path.name


def test_nginxs_own_variables_survive_the_substitution(tmp_path: Path) -> None:
    conf = rendered(tmp_path, {})
    for nginx_variable in ["$serving_request_id", "$http_x_request_id", "$msec", "$status"]:
        assert nginx_variable in conf


@pytest.mark.parametrize(
    ("settings", "present", "absent"),
    [
        ({}, ["keepalive 32;", "keepalive_timeout 4000ms;"], ["limit_req", "ssl", "real_ip"]),
        ({"SERVING_KEEPALIVE_S": "0"}, ["server 127.0.0.1:9;"], ["keepalive 32;"]),
        (
            {"NGINX_RATE_LIMIT_RPS": "5", "NGINX_RATE_LIMIT_BURST": "0"},
            ["rate=5r/s;", "limit_req zone=serving_per_client;"],
            ["burst="],
        ),
        (
            {"NGINX_TRUSTED_PROXIES": "10.0.0.0/8, fd00::/8"},
            [
                "set_real_ip_from 10.0.0.0/8;",
                "set_real_ip_from fd00::/8;",
                "real_ip_header X-Forwarded-For;",
            ],
            ["limit_req"],
        ),
    ],
    ids=["defaults", "keepalive-off", "rate-limit-without-burst", "trusted-proxies"],
)
def test_optional_parts_are_included_only_when_their_settings_ask(
    tmp_path: Path, settings: dict[str, str], present: list[str], absent: list[str]
) -> None:
    conf = rendered(tmp_path, settings)
    directives = "\n".join(line for line in conf.splitlines() if not line.lstrip().startswith("#"))
    for directive in present:
        assert directive in directives
    for directive in absent:
        assert directive not in directives


@pytest.mark.parametrize(
    ("settings", "present", "absent"),
    [
        (
            {},
            [
                "server_tokens off;",
                "limit_conn_zone $binary_remote_addr zone=serving_conn_per_client:10m;",
                "limit_conn serving_conn_per_client 128;",
                # 128m of bodies spooled at once: 128 bodies of 1 MiB; a length
                # of 6 digits or more may pass the 128k (131072) buffer.
                "limit_conn_zone $serving_body_spool zone=serving_body_spool:64k;",
                "limit_conn serving_body_spool 128;",
                '"~^:[0-9]{6,}$" spooled;',
                "limit_conn_status 429;",
                "keepalive_timeout 15s;",
                "client_header_timeout 10s;",
                "client_body_timeout 10s;",
                "send_timeout 10s;",
                "reset_timedout_connection on;",
                "worker_connections 1024;",
                "worker_rlimit_nofile 2048;",
                "add_header X-Content-Type-Options nosniff always;",
                "add_header X-Frame-Options DENY always;",
                "add_header Referrer-Policy no-referrer always;",
            ],
            [],
        ),
        (
            {
                "NGINX_CONN_LIMIT_PER_CLIENT": "0",
                "NGINX_BODY_SPOOL_BYTES": "0",
                "NGINX_KEEPALIVE_TIMEOUT_S": "0",
                "NGINX_CLIENT_TIMEOUT_S": "5",
                "NGINX_WORKER_CONNECTIONS": "4096",
            },
            [
                "keepalive_timeout 0s;",
                "client_body_timeout 5s;",
                "worker_connections 4096;",
                "worker_rlimit_nofile 8192;",
            ],
            ["limit_conn ", "limit_conn_zone"],
        ),
    ],
    ids=["defaults", "limit-off-keepalive-off"],
)
def test_slow_clients_and_banners_are_bounded_by_the_settings(
    tmp_path: Path, settings: dict[str, str], present: list[str], absent: list[str]
) -> None:
    conf = rendered(tmp_path, settings)
    directives = "\n".join(line for line in conf.splitlines() if not line.lstrip().startswith("#"))
    for directive in present:
        assert directive in directives
    for directive in absent:
        assert directive not in directives
    # Every block that sets headers of its own repeats the security headers
    # (nginx would otherwise drop the inherited ones there).
    for block in re.findall(r"location [^{]*\{[^}]*\}", directives):
        if "add_header" in block:
            assert "X-Frame-Options DENY" in block, block


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"NGINX_CONN_LIMIT_PER_CLIENT": "lots"}, "NGINX_CONN_LIMIT_PER_CLIENT"),
        ({"NGINX_CONN_LIMIT_PER_CLIENT": "-1"}, "NGINX_CONN_LIMIT_PER_CLIENT"),
        ({"NGINX_BODY_SPOOL_BYTES": "lots"}, "NGINX_BODY_SPOOL_BYTES"),
        ({"NGINX_BODY_SPOOL_BYTES": "1.5g"}, "NGINX_BODY_SPOOL_BYTES"),
        ({"NGINX_BODY_SPOOL_BYTES": "128mb"}, "NGINX_BODY_SPOOL_BYTES"),
        ({"NGINX_BODY_SPOOL_BYTES": "-1"}, "NGINX_BODY_SPOOL_BYTES"),
        ({"NGINX_KEEPALIVE_TIMEOUT_S": "1.5"}, "NGINX_KEEPALIVE_TIMEOUT_S"),
        ({"NGINX_CLIENT_TIMEOUT_S": "0"}, "NGINX_CLIENT_TIMEOUT_S"),
        ({"NGINX_WORKER_CONNECTIONS": "8"}, "NGINX_WORKER_CONNECTIONS"),
        ({"NGINX_PORT": "http"}, "NGINX_PORT"),
        ({"NGINX_PORT": "70000"}, "NGINX_PORT"),
        ({"NGINX_STATUS_PORT": "status"}, "NGINX_STATUS_PORT"),
        ({"NGINX_STATUS_PORT": "9090"}, "NGINX_STATUS_PORT"),  # the metrics port's
        ({"NGINX_GRPC_PORT": "grpc", "NGINX_GRPC_UPSTREAM": "app:8001"}, "NGINX_GRPC_PORT"),
        ({"NGINX_GRPC_PORT": "8080", "NGINX_GRPC_UPSTREAM": "app:8001"}, "NGINX_GRPC_PORT"),
        ({"NGINX_GRPC_PORT": "8081"}, "NGINX_GRPC_UPSTREAM"),
        ({"NGINX_GRPC_PORT": "8081", "NGINX_GRPC_UPSTREAM": "grpc://app"}, "NGINX_GRPC_UPSTREAM"),
        ({"NGINX_UPSTREAM": "http://app:8000"}, "NGINX_UPSTREAM"),
        ({"NGINX_UPSTREAM": "app:8000; evil"}, "NGINX_UPSTREAM"),
        ({"NGINX_UPSTREAM": "app"}, "NGINX_UPSTREAM"),
        ({"SERVING_MAX_BODY_BYTES": "1m"}, "SERVING_MAX_BODY_BYTES"),
        ({"SERVING_MAX_BODY_BYTES": "0"}, "SERVING_MAX_BODY_BYTES"),
        ({"SERVING_REQUEST_TIMEOUT_S": "-1"}, "SERVING_REQUEST_TIMEOUT_S"),
        ({"SERVING_REQUEST_TIMEOUT_S": "ten"}, "SERVING_REQUEST_TIMEOUT_S"),
        ({"SERVING_GENERATION_TIMEOUT_S": "-1"}, "SERVING_GENERATION_TIMEOUT_S"),
        ({"NGINX_RATE_LIMIT_RPS": "1.5"}, "NGINX_RATE_LIMIT_RPS"),
        ({"NGINX_TLS_CERT": "/etc/hostname"}, "NGINX_TLS_KEY"),
        ({"NGINX_TLS_CERT": "/no/cert.pem", "NGINX_TLS_KEY": "/no/key.pem"}, "NGINX_TLS_CERT"),
        ({"NGINX_TRUSTED_PROXIES": "10.0.0.0/8;"}, "NGINX_TRUSTED_PROXIES"),
        ({"NGINX_LOG_LEVEL": "verbose"}, "NGINX_LOG_LEVEL"),
        ({"NGINX_ACCESS_LOG": "access.log"}, "NGINX_ACCESS_LOG"),
    ],
)
def test_render_refuses_a_bad_setting_and_names_it(
    tmp_path: Path, settings: dict[str, str], named: str
) -> None:
    with pytest.raises(RenderError) as refused:
        render(settings, tmp_path / "conf")
    # The image's entrypoint stops with this status and message, before nginx starts.
    assert refused.value.returncode == 2
    assert named in refused.value.stderr
    assert not (tmp_path / "conf" / "nginx.conf").exists()


@pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed (make system-deps)")
@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"NGINX_RATE_LIMIT_RPS": "50"},
        {"NGINX_TRUSTED_PROXIES": "10.0.0.0/8,fd00::/8"},
        {"NGINX_RATE_LIMIT_RPS": "50", "NGINX_TRUSTED_PROXIES": "10.0.0.0/8,fd00::/8"},
        {
            "NGINX_CONN_LIMIT_PER_CLIENT": "0",
            "NGINX_BODY_SPOOL_BYTES": "0",
            "NGINX_KEEPALIVE_TIMEOUT_S": "0",
        },
        {"NGINX_BODY_SPOOL_BYTES": "1", "NGINX_CONN_LIMIT_PER_CLIENT": "0"},
        {"NGINX_STATUS_PORT": "8082"},
        {
            "NGINX_GRPC_PORT": "8081",
            "NGINX_GRPC_UPSTREAM": "127.0.0.1:8001",
            "NGINX_RATE_LIMIT_RPS": "5",
        },
        {"NGINX_UPSTREAM": "unix:/run/serving/gunicorn.sock", "NGINX_LISTEN_ADDRESS": "127.0.0.1"},
        {"SERVING_KEEPALIVE_S": "0", "NGINX_LISTEN_ADDRESS": "::1"},
        {"tls": "on"},
        {"tls": "on", "NGINX_RATE_LIMIT_RPS": "10", "NGINX_TRUSTED_PROXIES": "192.168.0.0/16"},
        CHART_SIDECAR,
    ],
    ids=[
        "defaults",
        "rate-limit",
        "trusted-proxies",
        "rate-limit-behind-proxies",
        "conn-limits-off-keepalive-off",
        "body-spool-only",
        "stub-status",
        "grpc",
        "unix-socket",
        "keepalive-off-ipv6",
        "tls",
        "everything-on",
        "chart-sidecar",
    ],
)
def test_every_rendered_form_passes_nginx_t(tmp_path: Path, settings: dict[str, str]) -> None:
    # The default upstream "app" resolves only on the compose network; nginx -t resolves it.
    settings = {"NGINX_UPSTREAM": "127.0.0.1:9", **settings}
    if settings.pop("tls", None):
        cert, key = make_certificate(tmp_path)
        settings |= {"NGINX_TLS_CERT": str(cert), "NGINX_TLS_KEY": str(key)}
    tested = nginx_t(render(settings, tmp_path / "conf"))
    assert tested.returncode == 0, tested.stderr


# -- one configuration ------------------------------------------------------------


def repository_files() -> list[Path]:
    """Every file git would commit: tracked and untracked, less the ignored."""
    listed = git_ls_files("--cached", "--others", "--exclude-standard")
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_nginx_templates_is_the_only_nginx_configuration_in_the_repository() -> None:
    holders = []
    for path in repository_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary: no configuration
        if NGINX_CONFIG_LINE.search(text):
            holders.append(path.relative_to(ROOT).as_posix())
    # One main config, and the gRPC server it includes (grpc.conf) beside it; the
    # other snippets have no upstream or proxy_pass.
    assert holders == ["nginx/templates/grpc.conf.template", "nginx/templates/nginx.conf.template"]


def test_the_image_runs_the_entrypoint_and_templates_the_tests_run() -> None:
    (stage,) = parse(ROOT / "nginx" / "Dockerfile")
    copies = {i.copy_sources()[0]: i.copy_destination() for i in stage.of("COPY")}
    # Exactly nginx/entrypoint.sh and nginx/templates, what tests/nginx_server runs.
    assert sorted(copies) == ["entrypoint.sh", "templates/"]
    (entrypoint,) = stage.of("ENTRYPOINT")
    assert json.loads(entrypoint.text) == [copies["entrypoint.sh"]]
    env = dict(word.split("=", 1) for i in stage.of("ENV") for word in i.words)
    assert env["NGINX_ENVSUBST_TEMPLATE_DIR"].rstrip("/") == copies["templates/"].rstrip("/")
    # The entrypoint renders into NGINX_ENVSUBST_OUTPUT_DIR, where the command looks.
    (cmd,) = stage.of("CMD")
    command = json.loads(cmd.text)
    assert command[:3] == ["nginx", "-c", f"{env['NGINX_ENVSUBST_OUTPUT_DIR']}/nginx.conf"]
