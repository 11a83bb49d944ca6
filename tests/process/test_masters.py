"""The masters of ``serving-core worker`` and ``serving-core stream`` (``process.prefork``):
nothing outlives them, and their /healthz and /metrics server is bounded."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from serving_core.process.health import MAX_CONNECTIONS
from tests.servers import ROOT, free_port, job_worker, spawn, stop, wait_for

pytestmark = pytest.mark.e2e

PROBE = str(ROOT / "tests/handlers/probe/handler.py")
# A stream over a Redis that is not there: its consumers would retry for ever, so
# one left behind by its master would show.
NOWHERE = f"redis://127.0.0.1:{free_port()}/0?stream=s"
COMMANDS = {
    "worker": {},
    "stream": {
        "SERVING_STREAM_SOURCE": NOWHERE,
        "SERVING_STREAM_SINK": NOWHERE,
        "SERVING_STREAM_DEAD_LETTER": NOWHERE,
    },
}


def session_members(sid: int) -> list[int]:
    """The processes left in session ``sid`` (``spawn`` starts each command in its own)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # fields[3]: the session id
            members.append(int(entry.name))
    return members


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on (``serve``, say)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_taken_health_port_stops_the_master_naming_it_and_leaves_no_consumer(
    command: str, taken_port: int, tmp_path: Path
) -> None:
    """New user's walk: ``stream`` and ``worker`` beside a running ``serve`` (SERVING_BIND's
    default is its port) forked their consumers before the port failed, and those
    consumed on with PPID 1; the error was a traceback that blamed the handler."""
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_BIND": f"127.0.0.1:{taken_port}",
        "SERVING_WORKERS": "2",
        "SERVING_JOBS_PATH": str(tmp_path / "jobs.db"),
        **COMMANDS[command],
    }
    log_path = tmp_path / "master.log"
    process = spawn(command, env, log_path)
    try:
        assert process.wait(60) == 2
        said = log_path.read_text()
        assert f"SERVING_BIND=127.0.0.1:{taken_port}: the port is taken" in said
        assert "Traceback" not in said
        assert "handler.py" not in said
        assert session_members(process.pid) == []
    finally:
        stop(process)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_consumers_stop_when_their_master_is_killed_outright(command: str, tmp_path: Path) -> None:
    """Nothing outlives its master, even a SIGKILLed one."""
    port = free_port()
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_WORKERS": "2",
        "SERVING_JOBS_PATH": str(tmp_path / "jobs.db"),
        **COMMANDS[command],
    }
    log_path = tmp_path / "master.log"
    process = spawn(command, env, log_path)
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        pids = wait_for(lambda: _consumers(url), log_path.read_text, 60)
        assert len(pids) == 2
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        wait_for(lambda: session_members(process.pid) == [], "the consumers' exit", 60)
    finally:
        stop(process)


def _consumers(url: str) -> list[int]:
    try:
        return list(requests.get(url, timeout=2).json()["pids"])
    except (requests.RequestException, ValueError):
        return []


def threads_of(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def test_idle_connections_to_the_health_port_are_bounded_and_closed(tmp_path: Path) -> None:
    """L7: the masters' /healthz + /metrics server started a thread per connection, with
    no timeout: connections that send nothing held a thread each, for ever."""
    with job_worker({"SERVING_JOBS_PATH": str(tmp_path / "jobs.db")}, tmp_path) as (
        process,
        url,
        _log,
    ):
        before = threads_of(process.pid)
        host, port = url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port)), 5) for _ in range(4 * MAX_CONNECTIONS)]
        try:
            # The master never runs more than MAX_CONNECTIONS threads for them ...
            wait_for(lambda: threads_of(process.pid) > before, "a thread for a connection")
            assert threads_of(process.pid) <= before + MAX_CONNECTIONS
            # ... and each idle connection is closed by the server, never held.
            for sock in idle:
                sock.settimeout(60)
                assert sock.recv(1024) == b""
        finally:
            for sock in idle:
                sock.close()
        assert requests.get(url + "/healthz", timeout=10).status_code == 200
        wait_for(lambda: threads_of(process.pid) <= before, "the connections' threads gone")
