"""Debian's real nginx on 127.0.0.1, configured by ``nginx/render.sh`` as the container is.

The container's entrypoint and these helpers run the same script over the
same templates; only the variables differ (a free port, a log file, the
upstream the test started). Every nginx started here is stopped when its
``with`` block ends, whatever happens inside it.
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

from tests.servers import ROOT, free_port, stop

RENDER = ROOT / "nginx" / "render.sh"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def render(settings: Mapping[str, str], out_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run ``nginx/render.sh out_dir`` with exactly ``settings`` (and PATH) in its environment."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **settings}
    return subprocess.run(
        ["sh", str(RENDER), str(out_dir)],
        env=env,
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
    """Render the config for ``upstream`` (host:port or unix:/path) and run nginx in front of it."""
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
        rendered = render(env, conf_dir)
        if rendered.returncode != 0:
            raise RuntimeError(f"nginx/render.sh failed:\n{rendered.stderr}")
        log_path = root / "nginx.log"
        conf = conf_dir / "nginx.conf"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [NGINX, "-p", str(root), "-c", str(conf), "-e", "stderr", "-g", "daemon off;"],
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
