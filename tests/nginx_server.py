"""Debian's real nginx on 127.0.0.1, configured from the environment by the image's entrypoint.

``render`` and ``nginx_server`` run ``nginx/entrypoint.sh`` itself, the script
the image runs as its ENTRYPOINT, over the same ``nginx/templates``; only the
variables differ (a free port, a log file, the upstream the test started, the
template and output folders). The script is executed, not handed to ``sh``, so
one committed without its executable bit fails here as it fails in the
container. Every nginx started here is stopped when its ``with`` block ends,
whatever happens inside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.servers import ROOT, free_port, require_marker, stop

ENTRYPOINT = ROOT / "nginx" / "entrypoint.sh"
TEMPLATES = ROOT / "nginx" / "templates"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


class RenderError(RuntimeError):
    """The image's entrypoint would stop: ``returncode`` and ``stderr`` say why."""

    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(f"rendering nginx's config failed ({returncode}):\n{stderr}")
        self.returncode = returncode
        self.stderr = stderr


def entrypoint_env(env: Mapping[str, str], out_dir: Path) -> dict[str, str]:
    """The container's ``env`` with this checkout's templates and ``out_dir`` for the output.

    Nothing else from this process's environment but PATH reaches the script.
    """
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **env,
        "NGINX_ENVSUBST_TEMPLATE_DIR": str(TEMPLATES),
        "NGINX_ENVSUBST_OUTPUT_DIR": str(out_dir),
    }


@contextlib.contextmanager
def executable_bit_hint() -> Iterator[None]:
    """Say how to fix it when the kernel refuses to execute the entrypoint."""
    try:
        yield
    except PermissionError as error:
        raise PermissionError(
            f"{ENTRYPOINT} cannot be executed, nor can the image's ENTRYPOINT: commit it "
            "executable (git update-index --chmod=+x nginx/entrypoint.sh; chmod +x it here)"
        ) from error


def render(env: Mapping[str, str], out_dir: Path) -> Path:
    """Render nginx's config with the image's entrypoint; returns ``out_dir/nginx.conf``.

    ``env`` is the container's environment (the NGINX_* and SERVING_* settings).
    The output directory is ``out_dir`` whatever ``env`` says, so the pid and
    temp paths land there too and ``nginx -t`` can run on the result. The
    entrypoint's command is ``true``: it checks, renders and runs nothing else.
    Raises ``RenderError`` where the container would refuse to start.
    """
    out_dir = Path(out_dir).resolve()
    with executable_bit_hint():
        result = subprocess.run(
            [str(ENTRYPOINT), "true"],
            env=entrypoint_env(env, out_dir),
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    conf = out_dir / "nginx.conf"
    if result.returncode != 0 or not conf.exists():
        raise RenderError(result.returncode, result.stderr + result.stdout)
    return conf


def nginx_t(conf: Path) -> subprocess.CompletedProcess[str]:
    """``nginx -t`` on a rendered ``conf`` (its prefix is its directory; nothing is bound)."""
    return subprocess.run(
        [NGINX, "-t", "-p", str(conf.parent), "-c", str(conf), "-e", "stderr"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )


@dataclass
class Nginx:
    process: subprocess.Popen[bytes]
    port: int
    url: str
    metrics_url: str
    conf_dir: Path
    access_log: Path
    log_path: Path

    def output(self) -> str:
        """nginx's error log (stderr) so far."""
        return self.log_path.read_text(errors="replace")

    def access_entries(self) -> list[dict[str, Any]]:
        text = self.access_log.read_text() if self.access_log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def access_entry(self, request_id: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """The access log line of ``request_id`` (nginx writes it just after the response)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [e for e in self.access_entries() if e["request_id"] == request_id]
            if found:
                assert len(found) == 1, found
                return found[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no access log line for {request_id}:\n{self.access_log}")
            time.sleep(0.05)


@contextlib.contextmanager
def nginx_server(
    upstream: str, settings: Mapping[str, str] | None = None, *, ready_timeout_s: float = 15.0
) -> Iterator[Nginx]:
    """Run nginx in front of ``upstream`` (host:port or unix:/path), started by the entrypoint."""
    require_marker("e2e", "nginx")
    with tempfile.TemporaryDirectory(prefix="serving-nginx-") as tmp:
        root = Path(tmp)
        # Run as root, nginx's workers drop to nobody: they must reach the temp dirs.
        root.chmod(0o755)
        port, metrics_port = free_port(), free_port()
        access_log = root / "access.log"
        env = {
            "NGINX_UPSTREAM": upstream,
            "NGINX_LISTEN_ADDRESS": "127.0.0.1",
            "NGINX_PORT": str(port),
            "NGINX_METRICS_PORT": str(metrics_port),
            "NGINX_ACCESS_LOG": str(access_log),
            "NGINX_WORKER_PROCESSES": "2",
            **(settings or {}),
        }
        conf_dir = root / "conf"
        conf = conf_dir / "nginx.conf"
        log_path = root / "nginx.log"
        # As the container starts: the entrypoint checks and renders, then
        # execs nginx (the same process, so stopping it stops nginx).
        command = [NGINX, "-p", str(root), "-c", str(conf), "-e", "stderr", "-g", "daemon off;"]
        with log_path.open("wb") as log, executable_bit_hint():
            process = subprocess.Popen(
                [str(ENTRYPOINT), *command],
                env=entrypoint_env(env, conf_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Nginx(
            process,
            port,
            f"http://127.0.0.1:{port}",
            f"http://127.0.0.1:{metrics_port}",
            conf_dir,
            access_log,
            log_path,
        )
        try:
            _wait_ready(server, ready_timeout_s)
            yield server
        finally:
            stop(process)


def _wait_ready(server: Nginx, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"nginx exited with {server.process.returncode}:\n{server.output()}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(server.url + "/_nginx/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nginx not ready after {timeout_s} s:\n{server.output()}")


def wait_until_ready(url: str, timeout_s: float = 90.0) -> None:
    """Poll ``url``/readyz until 200: the app behind nginx has loaded its handler."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + "/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url}/readyz not 200 after {timeout_s} s")
