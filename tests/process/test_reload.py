"""End to end: ``serving-core serve --reload`` (serving_core.process.reload) serves an edited
handler.py with no restart and no failed request, while clients keep sending; an edit
that breaks the contract leaves the old version serving and says why."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.load import ClientThreads
from tests.servers import ROOT, SERVING_CORE, base_env, gunicorn_server, wait_for

pytestmark = pytest.mark.e2e

STOPPED = "the previous version (pid"  # the reloader's line once the old server has exited
FAILED = "did not start"  # ... and once a new one failed its start


def handler_source(version: int, *, setup: str = "pass", predict: str = "") -> str:
    """A handler that answers its ``version``; ``setup`` and ``predict`` bodies may break it."""
    return textwrap.dedent(
        f"""
        from serving_core import Handler


        class Versioned(Handler):
            def setup(self):
                {setup}

            def predict(self, params):
                {predict or "pass"}
                return {{"version": {version}, "text": params["text"]}}
        """
    )


def write_handler(folder: Path, source: str) -> Path:
    path = folder / "handler.py"
    path.write_text(source)
    return path


@dataclass
class Sent:
    started: float
    version: int | None  # None: no answer, or not a 200
    failure: str  # empty when it was answered 200


class Clients(ClientThreads[Sent]):
    """Threads sending requests back to back until ``stop``: half on one keep-alive
    connection each (as a program's client does), half on a new connection each."""

    def __init__(self, url: str, clients: int = 4) -> None:
        super().__init__(url, clients)

    def _client(self, n: int) -> None:
        keep_alive = n % 2 == 0
        session = requests.Session()
        i = 0
        while not self._stop.is_set():
            i += 1
            started = time.monotonic()
            try:
                response = session.post(
                    self.url + "/predict",
                    json={"text": f"c{n}-{i}"},
                    headers={} if keep_alive else {"Connection": "close"},
                    timeout=60,
                )
            except requests.RequestException as exc:
                sent = Sent(started, None, repr(exc))
            else:
                ok = response.status_code == 200
                sent = Sent(
                    started,
                    response.json()["version"] if ok else None,
                    "" if ok else f"{response.status_code} {response.text}",
                )
            with self._lock:
                self.sent.append(sent)

    def answers_since(self, since: float) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.started >= since]

    def failures(self) -> list[str]:
        with self._lock:
            return [s.failure for s in self.sent if s.failure]


def edit_and_wait(server, path: Path, source: str, line: str) -> float:
    """Write ``source`` over the handler, and wait for the reloader's next ``line``;
    returns when it was logged."""
    before = server.output().count(line)
    path.write_text(source)
    wait_for(
        lambda: server.output().count(line) > before,
        lambda: f"{line!r} in the log:\n{without_access_lines(server.output())}",
        timeout_s=120,
    )
    return time.monotonic()


def without_access_lines(log: str) -> str:
    """The log but the clients' access lines, which would bury the rest."""
    return "\n".join(line for line in log.splitlines() if '"POST /predict' not in line)


def served_only(clients: Clients, since: float, version: int, count: int = 20) -> set[int | None]:
    """The versions answered to requests sent from ``since``, once there are ``count``."""
    wait_for(
        lambda: len(clients.answers_since(since)) >= count,
        f"{count} answers to version {version}",
        timeout_s=60,
    )
    return {s.version for s in clients.answers_since(since)}


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="gevent"),
        pytest.param({"SERVING_WORKER_CLASS": "gthread"}, id="gthread"),
        pytest.param({"SERVING_MODEL_PROCESS": "shared"}, id="model-process"),
    ],
)
def test_an_edit_to_predict_is_served_with_no_restart_and_no_failed_request(tmp_path, env):
    path = write_handler(tmp_path, handler_source(1))
    (tmp_path / "sample.json").write_text('{"text": "warm-up"}')
    with gunicorn_server(
        {"SERVING_WORKERS": "2", **env}, args=["--reload", str(tmp_path)]
    ) as server:
        clients = Clients(server.url).start()
        try:
            assert served_only(clients, 0.0, 1) == {1}
            stopped = edit_and_wait(server, path, handler_source(2), STOPPED)
            # Once the old server has gone, every answer is the new version's.
            assert served_only(clients, stopped, 2) == {2}
            # A second edit, the same way.
            stopped = edit_and_wait(server, path, handler_source(3), STOPPED)
            assert served_only(clients, stopped, 3) == {3}
        finally:
            clients.stop()
        assert server.process.poll() is None  # the same command, never restarted
        log = server.output()
    assert clients.failures() == [], log
    versions = [s.version for s in clients.sent]
    assert versions[0] == 1
    assert versions[-1] == 3


def test_a_broken_edit_leaves_the_old_version_serving_and_says_why(tmp_path):
    path = write_handler(tmp_path, handler_source(1))
    (tmp_path / "sample.json").write_text('{"text": "warm-up"}')
    broken = [
        # Each: the source, and what the log then says beside the file's name.
        (
            handler_source(2).replace("def predict(self, params):", "def predict(self, params"),
            "SyntaxError",
        ),
        (handler_source(2, setup='raise RuntimeError("no model in setup")'), "no model in setup"),
        # The sample's warm-up fails in each worker: what a worker's start checks.
        (handler_source(2, predict='raise ValueError("sample refused")'), "sample refused"),
    ]
    with gunicorn_server({"SERVING_WORKERS": "2"}, args=["--reload", str(tmp_path)]) as server:
        clients = Clients(server.url).start()
        try:
            assert served_only(clients, 0.0, 1) == {1}
            for source, reason in broken:
                logged = len(server.output())
                failed = edit_and_wait(server, path, source, FAILED)
                said = server.output()[logged:]
                assert str(path) in said, said
                assert reason in said, said
                assert "the previous version serves on" in said, said
                assert served_only(clients, failed, 1) == {1}, said
            # The next good edit is picked up.
            stopped = edit_and_wait(server, path, handler_source(2), STOPPED)
            assert served_only(clients, stopped, 2) == {2}
        finally:
            clients.stop()
        log = server.output()
    assert clients.failures() == [], log


def test_a_handler_broken_at_start_is_served_once_fixed(tmp_path):
    path = write_handler(tmp_path, handler_source(1).replace("):", ")", 1))
    args = ["--reload", str(tmp_path)]
    with gunicorn_server({"SERVING_WORKERS": "1"}, args=args, wait_ready=False) as server:
        wait_for(
            lambda: "did not start" in server.output(),
            lambda: f"the first start to fail:\n{server.output()}",
            timeout_s=60,
        )
        assert "SyntaxError" in server.output()
        assert "nothing is served" in server.output()
        path.write_text(handler_source(2))
        wait_for(
            lambda: "--reload: serving (pid" in server.output(),
            lambda: f"the fixed handler served:\n{server.output()}",
            timeout_s=60,
        )
        answer = requests.post(server.url + "/predict", json={"text": "hi"}, timeout=30)
    assert answer.json() == {"version": 2, "text": "hi"}


def test_an_edit_during_a_start_overtakes_it(tmp_path):
    path = write_handler(tmp_path, handler_source(1))
    in_setup = tmp_path.parent / f"{tmp_path.name}-in-setup"
    # Version 2 never finishes its setup(): only a later edit can take its place.
    stuck = f'open(r"{in_setup}", "w").close(); __import__("time").sleep(3600)'
    with gunicorn_server({"SERVING_WORKERS": "2"}, args=["--reload", str(tmp_path)]) as server:
        clients = Clients(server.url).start()
        try:
            assert served_only(clients, 0.0, 1) == {1}
            path.write_text(handler_source(2, setup=stuck))
            wait_for(in_setup.exists, "version 2 in its setup()", timeout_s=60)
            stopped = edit_and_wait(server, path, handler_source(3), STOPPED)
            assert served_only(clients, stopped, 3) == {3}
        finally:
            clients.stop()
        log = server.output()
    assert clients.failures() == [], log
    assert {s.version for s in clients.sent} == {1, 3}
    assert "a start overtaken by an edit (pid" in log
    assert FAILED not in log
    assert log.count(STOPPED) == 1


def over_unix(path: str) -> int | None:
    """The version a POST /predict over the unix socket at ``path`` answers."""
    body = b'{"text": "hi"}'
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(
            b"POST /predict HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    if head.split()[1:2] != [b"200"]:
        return None
    return int(json.loads(payload)["version"])


def test_a_unix_socket_keeps_its_path_across_a_reload(tmp_path):
    # gunicorn unlinks a unix socket's path when its master stops: the old server's
    # stop would leave the new one listening on a socket no client can reach.
    (tmp_path / "handler").mkdir()
    path = write_handler(tmp_path / "handler", handler_source(1))
    bind = str(tmp_path / "serving.sock")
    env = {"SERVING_WORKERS": "1", "SERVING_BIND": f"unix:{bind}"}
    with gunicorn_server(env, args=["--reload", str(path.parent)]) as server:
        assert over_unix(bind) == 1
        edit_and_wait(server, path, handler_source(2), STOPPED)
        assert Path(bind).exists()
        assert over_unix(bind) == 2
    assert not Path(bind).exists()  # the reloader's own stop removes it


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SERVING_GRPC_PORT": "50051"}, "--reload does not serve gRPC (SERVING_GRPC_PORT=50051)"),
        ({"SERVING_METRICS_DIR": "/tmp/m"}, "unset SERVING_METRICS_DIR, or serve without --reload"),
        ({"SERVING_HANDLER": "no.such.module"}, "--reload: the handler 'no.such.module' is not"),
    ],
)
def test_reload_refuses_what_it_cannot_serve_before_it_binds(env, message):
    result = subprocess.run(
        [str(SERVING_CORE), "serve", "--reload"],
        cwd=ROOT,
        env=base_env({"SERVING_HANDLER": "handlers/echo", **env}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("serving-core: error: "), result.stderr
    assert message in result.stderr


def test_serve_help_offers_reload_and_hides_the_handoff():
    result = subprocess.run(
        [str(SERVING_CORE), "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "--reload" in result.stdout
    assert "--handoff" not in result.stdout  # the reloader's, to its servers


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_reloader_and_every_server_it_started(tmp_path, sig):
    write_handler(tmp_path, handler_source(1))
    with gunicorn_server({"SERVING_WORKERS": "2"}, args=["--reload", str(tmp_path)]) as server:
        # SIGINT: a terminal's Ctrl-C (quick); SIGTERM: a drain, as serve's.
        server.process.send_signal(sig)
        assert server.process.wait(60) == 0
        # The servers, their workers: the whole process group has gone.
        wait_for(lambda: not group_alive(server.pid), "every process of the group to exit")


def test_a_reloader_killed_outright_takes_its_servers_with_it(tmp_path):
    write_handler(tmp_path, handler_source(1))
    with gunicorn_server({"SERVING_WORKERS": "2"}, args=["--reload", str(tmp_path)]) as server:
        server.process.kill()
        server.process.wait(60)
        # Each server is sent SIGTERM as its parent dies, and stops as serve's does.
        wait_for(lambda: not group_alive(server.pid), "every server to exit", timeout_s=60)
