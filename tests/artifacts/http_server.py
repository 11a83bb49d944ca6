"""Debian's real nginx serving a folder on 127.0.0.1: ranged GETs, ETags, If-Match, and
``limit_rate`` to make a fetch slow enough to interrupt. Its access log has one
JSON line a response: method, path, status, Range and the body bytes sent."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from tests.servers import free_port, require_marker, stop

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
CONF = """
daemon off;
worker_processes 2;
pid {root}/nginx.pid;
error_log stderr;
events {{ worker_connections 64; }}
http {{
    log_format fetches escape=json '{{"method":"$request_method","path":"$uri",'
        '"status":$status,"range":"$http_range","query":"$args","bytes":$body_bytes_sent}}';
    access_log {root}/access.log fetches;
    client_body_temp_path {root}/tmp; proxy_temp_path {root}/tmp;
    fastcgi_temp_path {root}/tmp; uwsgi_temp_path {root}/tmp; scgi_temp_path {root}/tmp;
    server {{
        listen 127.0.0.1:{port};
        root {root}/www;
        location = /healthz {{ return 200; }}
        location /slow/ {{ limit_rate {rate}; }}
        location /private/ {{ deny all; }}
    }}
}}
"""


@dataclass
class StaticServer:
    url: str
    www: Path  # what it serves: /slow/ at ``rate`` a connection, /private/ always 403
    access_log: Path

    def entries(self) -> list[dict[str, Any]]:
        text = self.access_log.read_text() if self.access_log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def sent(self, path: str) -> list[dict[str, Any]]:
        """The GETs of ``path`` answered with a body (200 or 206)."""
        return [
            e
            for e in self.entries()
            if e["path"] == path and e["method"] == "GET" and e["status"] in (200, 206)
        ]


@contextlib.contextmanager
def static_nginx(*, rate: str = "8m") -> Iterator[StaticServer]:
    require_marker("e2e", "nginx")
    with tempfile.TemporaryDirectory(prefix="serving-www-") as tmp:
        root = Path(tmp)
        # Run as root, nginx's workers drop to nobody: they must read what they serve.
        root.chmod(0o755)
        (root / "www").mkdir(mode=0o755)
        (root / "tmp").mkdir()
        port = free_port()
        conf = root / "nginx.conf"
        conf.write_text(CONF.format(root=root, port=port, rate=rate))
        log_path = root / "nginx.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [NGINX, "-p", str(root), "-c", str(conf), "-e", "stderr"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = StaticServer(f"http://127.0.0.1:{port}", root / "www", root / "access.log")
        try:
            _wait_ready(process, server, log_path)
            yield server
        finally:
            stop(process)


def _wait_ready(process: subprocess.Popen[bytes], server: StaticServer, log_path: Path) -> None:
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited:\n{log_path.read_text(errors='replace')}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(server.url + "/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nginx not ready:\n{log_path.read_text(errors='replace')}")
