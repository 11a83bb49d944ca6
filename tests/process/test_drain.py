"""End to end: SIGTERM drains a real server (serving_core.process.drain). /readyz turns 503 while
requests are still served for SERVING_DRAIN_S, then the socket closes; nothing accepted
before the signal fails; every worker leaves promptly, whenever the signal comes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.conftest import PROBE
from tests.load import ClientThreads
from tests.nginx_server import nginx_server, wait_until_ready
from tests.servers import gunicorn_server, wait_for

pytestmark = pytest.mark.e2e

DRAIN_S = 4.0
# A lost SIGTERM shows as the master waiting this long before it kills a worker;
# a prompt exit takes a second or two, so the bound below cannot be met by a lost one.
GRACEFUL_S = 60.0
PROMPT_S = 20.0


@dataclass
class Sent:
    started: float
    status: int | None  # None: no HTTP answer (refused, reset)


class Load(ClientThreads[Sent]):
    """``clients`` threads sending distinct requests back to back, each on a new
    connection (as a balancer opens them), until ``stop``."""

    def _client(self, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            started = time.monotonic()
            status = None
            with contextlib.suppress(requests.RequestException):
                status = requests.post(
                    self.url + "/predict",
                    json={"text": f"c{n}-{i}", "sleep_s": 0.05},
                    headers={"Connection": "close"},
                    timeout=60,
                ).status_code
            with self._lock:
                self.sent.append(Sent(started, status))
            if status is None:
                time.sleep(0.05)  # refused: do not spin

    def answered(self, since: float) -> int:
        with self._lock:
            return sum(s.status == 200 for s in self.sent if s.started >= since)


def status_of(url: str) -> int | None:
    try:
        return requests.get(url, timeout=10).status_code
    except requests.RequestException:
        return None


@pytest.mark.parametrize("worker_class", ["gevent", "gthread"])
def test_sigterm_under_load_turns_readyz_503_first_and_fails_nothing_accepted(worker_class):
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKER_CLASS": worker_class,
        "SERVING_WORKERS": "2",
        "SERVING_DRAIN_S": str(DRAIN_S),
        "SERVING_GRACEFUL_TIMEOUT_S": str(GRACEFUL_S),
    }
    with gunicorn_server(env) as server:
        load = Load(server.url, clients=8).start()
        try:
            wait_for(lambda: load.answered(0.0) >= 20, "20 answers before the signal", timeout_s=60)
            signalled = time.monotonic()
            os.kill(server.pid, signal.SIGTERM)  # the master alone, as Kubernetes sends it
            wait_for(lambda: status_of(server.url + "/readyz") == 503, "/readyz 503", timeout_s=30)
            unready = time.monotonic()
            # Served while unready: requests sent after /readyz said 503 get 200s.
            wait_for(
                lambda: load.answered(unready) >= 5, "answers while /readyz is 503", timeout_s=60
            )
            # After the drain the socket closes: new connections are refused.
            wait_for(
                lambda: status_of(server.url + "/healthz") is None,
                "the socket closed",
                timeout_s=DRAIN_S + 30,
            )
            closed = time.monotonic()
            assert server.process.wait(PROMPT_S + GRACEFUL_S) == 0
        finally:
            load.stop()
        log = server.output()
    assert closed - signalled >= DRAIN_S - 0.5, log  # the workers kept accepting meanwhile
    # Nothing sent before the signal, nor during the first half of the drain, failed.
    early = [s for s in load.sent if s.started < signalled + DRAIN_S / 2]
    assert early
    assert [s for s in early if s.status != 200] == [], log
    assert log.count("Worker exiting") == 2
    assert "graceful timeout" not in log
    assert "SIGKILL" not in log


def http_status_over_unix(path: str, target: str) -> int | None:
    """One HTTP/1.0 GET over a unix socket; None when nothing listens there."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(path)
            sock.sendall(f"GET {target} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
            head = sock.recv(64)
    except OSError:
        return None
    return int(head.split()[1]) if head.startswith(b"HTTP/") else None


def test_a_unix_socket_keeps_its_path_and_answers_until_the_drain_is_over(tmp_path):
    # gunicorn unlinked the path as soon as the master handled SIGTERM, and nginx got
    # a 502 for every new connection although the workers were still serving.
    path = str(tmp_path / "serving.sock")
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "2",
        "SERVING_BIND": f"unix:{path}",
        "SERVING_DRAIN_S": str(DRAIN_S),
    }
    with gunicorn_server(env) as server:
        wait_for(lambda: http_status_over_unix(path, "/readyz") == 200, "ready", timeout_s=60)
        signalled = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        wait_for(lambda: http_status_over_unix(path, "/readyz") == 503, "/readyz 503", timeout_s=60)
        statuses = []
        while time.monotonic() < signalled + DRAIN_S / 2:
            statuses.append(http_status_over_unix(path, "/healthz"))
            time.sleep(0.1)
        assert statuses
        assert set(statuses) == {200}
        assert server.process.wait(PROMPT_S + DRAIN_S) == 0
    assert not Path(path).exists()


def test_behind_nginx_the_drain_answers_every_request_and_readyz_503():
    # What the chart runs: nginx in front, gunicorn on a unix socket. gunicorn
    # unlinked the socket on SIGTERM and nginx answered 502 at once.
    with tempfile.TemporaryDirectory(prefix="serving-sock-") as tmp:
        Path(tmp).chmod(0o755)  # nginx's workers run as nobody under a root test run
        path = str(Path(tmp) / "gunicorn.sock")
        env = {
            "SERVING_HANDLER": PROBE,
            "SERVING_WORKERS": "2",
            "SERVING_BIND": f"unix:{path}",
            "SERVING_DRAIN_S": str(DRAIN_S),
        }
        with gunicorn_server(env) as app, nginx_server(app.bind) as proxy:
            wait_until_ready(proxy.url)
            load = Load(proxy.url, clients=8).start()
            try:
                wait_for(
                    lambda: load.answered(0.0) >= 20, "20 answers before the signal", timeout_s=60
                )
                signalled = time.monotonic()
                os.kill(app.pid, signal.SIGTERM)
                wait_for(
                    lambda: status_of(proxy.url + "/readyz") == 503,
                    "/readyz 503 via nginx",
                    timeout_s=60,
                )
                unready = time.monotonic()
                wait_for(
                    lambda: load.answered(unready) >= 5,
                    "answers while /readyz is 503",
                    timeout_s=60,
                )
                assert app.process.wait(PROMPT_S + DRAIN_S) == 0
            finally:
                load.stop()
            log = app.output()
    early = [s for s in load.sent if s.started < signalled + DRAIN_S / 2]
    assert early
    assert [s.status for s in early if s.status != 200] == [], log


def test_sigterm_to_the_process_group_stops_every_worker_promptly_each_time():
    # A worker that got SIGTERM before its own handlers were installed (just after it
    # logged "ready") lost it and served on; the master waited its whole graceful
    # timeout. Ten starts, each signalled as soon as the workers say they are ready.
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "2",
        "SERVING_GRACEFUL_TIMEOUT_S": str(GRACEFUL_S),
    }
    took = []
    for _ in range(10):
        with gunicorn_server(env) as server:
            burst = threading.Thread(
                target=lambda url=server.url: [status_of(url + "/healthz") for _ in range(5)],
                daemon=True,
            )
            burst.start()
            started = time.monotonic()
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.process.wait(PROMPT_S)
            except Exception:
                raise AssertionError(
                    f"the server did not stop within {PROMPT_S} s:\n{server.output()}"
                ) from None
            took.append(time.monotonic() - started)
            burst.join(30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, 0)
                raise AssertionError(f"a worker outlived its master:\n{server.output()}")
    assert max(took) < PROMPT_S
