"""Real processes for end-to-end tests: ``serving-core serve`` (gunicorn) on 127.0.0.1.

Every server started here is stopped (SIGTERM to its process group, then
SIGKILL) when its ``with`` block ends, whatever happens inside it.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import requests
import yaml

from serving_core.cores import usable_cores

ROOT = Path(__file__).resolve().parent.parent
SERVING_CORE = Path(sys.executable).parent / "serving-core"
T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], what: str | Callable[[], str], timeout_s: float = 10.0
) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail
    naming ``what`` (a text, or what makes one then, e.g. a log's tail) after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s} s waiting for {said}")
        time.sleep(0.02)
    return value


def wait_port(
    process: subprocess.Popen[bytes], port: int, log_path: Path, name: str, timeout_s: float = 30.0
) -> None:
    """Until 127.0.0.1:``port`` accepts a connection; fail with ``name``'s log if its
    ``process`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{name} exited with {process.returncode}:\n{log_path.read_text(errors='replace')}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.02)
    raise RuntimeError(
        f"{name} not ready after {timeout_s} s:\n{log_path.read_text(errors='replace')}"
    )


def git_ls_files(*options: str) -> list[str]:
    """``git ls-files -z OPTIONS`` in the repository: one entry per file."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return [entry for entry in listed.split("\0") if entry]


def image_workflow_env() -> dict[str, str]:
    """The env of .github/workflows/image.yml: HANDLER_DIR and SHARED_DIRS of the images."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "image.yml").read_text())
    return {k: str(v) for k, v in workflow["env"].items()}


def served_handler_dir() -> str:
    """The handler the images serve: image.yml's ``env: HANDLER_DIR``, the one place a
    template's owner names it (README, "Your model", step 5)."""
    return image_workflow_env()["HANDLER_DIR"].rstrip("/")


# The ports free_port handed out last: a test takes several (an app's HTTP and gRPC
# ports, nginx's) before anything binds them, and the kernel may offer one twice.
_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=256)


def free_port() -> int:
    """A port nothing listens on now, and none of the last ones handed out here."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


# The test being set up or run (conftest records it before its fixtures start).
RUNNING: list[pytest.Item] = []


def require_marker(marker: str, what: str) -> None:
    """Fail the running test if it starts ``what`` without carrying ``marker``.

    `make test-fast` leaves tests out by their markers (pyproject's list), chosen
    before anything runs: a test, or its fixture's param, says that it starts one."""
    if RUNNING and RUNNING[-1].get_closest_marker(marker) is None:
        pytest.fail(
            f"{RUNNING[-1].nodeid} starts {what}: mark it @pytest.mark.{marker} (a fixture's "
            f"param: pytest.param(..., marks=pytest.mark.{marker})), so that make test-fast "
            "leaves it out",
            pytrace=False,
        )


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    bind: str
    url: str
    log_path: Path

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def pid(self) -> int:
        return self.process.pid


def base_env(overrides: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVING_")}
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


@contextlib.contextmanager
def gunicorn_server(
    overrides: Mapping[str, str],
    *,
    ready_timeout_s: float = 90.0,
    wait_ready: bool = True,
    args: Sequence[str] = (),
) -> Iterator[Server]:
    """Run ``serving-core serve [ARGS]`` with ``overrides`` on a free port; yields once
    /readyz is 200."""
    require_marker("e2e", "serving-core serve")
    overrides = dict(overrides)
    port = free_port()
    overrides.setdefault("SERVING_BIND", f"127.0.0.1:{port}")
    bind = overrides["SERVING_BIND"]
    url = f"http://{bind}" if not bind.startswith("unix:") else ""
    with tempfile.TemporaryDirectory(prefix="serving-test-") as tmp:
        # Its own job queue file: the default one is shared by the whole machine.
        overrides.setdefault("SERVING_JOBS_PATH", str(Path(tmp) / "jobs.db"))
        log_path = Path(tmp) / "server.log"
        process = spawn("serve", overrides, log_path, args)
        server = Server(process, bind, url, log_path)
        try:
            if wait_ready:
                # The server's own default: cgroup quota and affinity mask alike.
                workers = int(overrides.get("SERVING_WORKERS") or usable_cores())
                _wait_ready(server, ready_timeout_s, workers)
            yield server
        finally:
            # Quick: a graceful stop waited for every keep-alive connection a test's
            # clients left open to time out (SERVING_KEEPALIVE_S), and for a gevent
            # worker's one-second loop, ~3.5 s a server: a third of tests/web's time.
            # The tests of SIGTERM send it themselves, inside their block; nothing
            # reads a server after it (its log is in this temporary directory).
            stop(process, quick=True)


def spawn(
    command: str, overrides: Mapping[str, str], log_path: Path, args: Sequence[str] = ()
) -> subprocess.Popen[bytes]:
    """``serving-core COMMAND [ARGS]`` in a process group of its own (``stop`` ends it whole),
    stdout and stderr into ``log_path``."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [str(SERVING_CORE), command, *args],
            cwd=ROOT,
            env=base_env(overrides),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes], timeout_s: float = 30.0, *, quick: bool = False) -> None:
    """Stop ``process`` and its process group: SIGTERM to the group (each process
    finishes its work), or ``quick``, gunicorn's quick shutdown (SIGINT to its
    master, which stops its workers at once: Ctrl-C); SIGKILL to whatever is left
    once it has exited or after ``timeout_s``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            if quick:
                os.kill(process.pid, signal.SIGINT)
            else:
                os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout_s)
    # Workers of a master that died are in the same process group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    if process.poll() is None:
        process.wait(10)


def _wait_ready(server: Server, timeout_s: float, workers: int) -> None:
    """Until /readyz answers (or the socket exists) and every worker logged that it is ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"server exited with {server.process.returncode}:\n{server.output()}"
            )
        if server.output().count(" ready: ") < workers:
            time.sleep(0.1)
            continue
        if server.url:
            with contextlib.suppress(requests.RequestException):
                if requests.get(server.url + "/readyz", timeout=1).status_code == 200:
                    return
        elif Path(server.bind[len("unix:") :]).exists():
            return
        time.sleep(0.1)
    raise RuntimeError(f"server not ready after {timeout_s} s:\n{server.output()}")


def wait_for_worker_pids(url: str, count: int, timeout_s: float = 10.0) -> set[int]:
    """Until ``count`` workers have answered the probe handler (tests/handlers/probe),
    each request on a new connection: a worker logs "ready" before its loop accepts."""
    pids: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(pids) < count and time.monotonic() < deadline:
        response = requests.post(url + "/predict", json={"text": "hello"}, timeout=10)
        pids.add(int(response.json()["pid"]))
        if len(pids) < count:
            time.sleep(0.05)
    if len(pids) < count:
        raise RuntimeError(f"only workers {sorted(pids)} answered within {timeout_s} s")
    return pids


@contextlib.contextmanager
def job_worker(
    overrides: Mapping[str, str], log_dir: Path, *, ready_timeout_s: float = 90.0
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """Run ``serving-core worker`` (the probe handler unless ``overrides`` names one) with
    its /healthz on a free port; yields (process, health URL, log path) once healthy."""
    require_marker("e2e", "serving-core worker")
    port = free_port()
    log_path = log_dir / f"worker-{port}.log"
    env = {
        "SERVING_HANDLER": str(ROOT / "tests/handlers/probe/handler.py"),
        "SERVING_BIND": f"127.0.0.1:{port}",
        **overrides,
    }
    process = spawn("worker", env, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not become healthy:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield process, url, log_path
    finally:
        stop(process)


def _healthy(url: str) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(url + "/healthz", timeout=1).status_code == 200
    return False
