"""Debian's real nginx on 127.0.0.1, configured from the environment as the image is.

``render`` runs the image's configuration steps here: the same
``nginx/docker-entrypoint.d/*.envsh`` over the same ``nginx/templates``, with
the same envsubst filter; only the variables differ (a free port, a log file,
the upstream the test started). Every nginx started here is stopped when its
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

ENTRYPOINT_D = ROOT / "nginx" / "docker-entrypoint.d"
TEMPLATES = ROOT / "nginx" / "templates"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

# The two configuration steps of the official image's entrypoint, rewritten
# here with the same behaviour; upstream they are entrypoint/docker-entrypoint.sh
# and entrypoint/20-envsubst-on-templates.sh in nginxinc/docker-nginx, which the
# base image (nginxinc/nginx-unprivileged) ships as they are. Left out: logging,
# stream templates and the final `exec nginx`.
#
# docker-entrypoint.sh: the files of /docker-entrypoint.d in `sort -V` order;
# a readable *.envsh is sourced, an executable *.sh is run. This happens under
# `set -e` in the last stage of a pipeline, so an envsh's `exit` stops the
# entrypoint with its status, and what an envsh exports reaches the scripts
# run after it (20-envsubst-on-templates.sh) but not nginx.
DOCKER_ENTRYPOINT = r"""
set -e
find "$1" -follow -type f -print | sort -V | while read -r entry; do
    case $entry in
        *.envsh) [ ! -r "$entry" ] || . "$entry" ;;
        *.sh) [ ! -x "$entry" ] || "$entry" ;;
    esac
done
"""
# 20-envsubst-on-templates.sh: each *.template under NGINX_ENVSUBST_TEMPLATE_DIR
# (found with `find -follow`, subfolders kept) becomes the same path, less the
# suffix, under NGINX_ENVSUBST_OUTPUT_DIR. envsubst is given the names of the
# environment variables that match NGINX_ENVSUBST_FILTER as an awk regex, so no
# other `$name` is touched. An output directory that is not writable skips the
# step with a message and exit status 0.
ENVSUBST_ON_TEMPLATES = r"""#!/bin/sh
set -e
templates=${NGINX_ENVSUBST_TEMPLATE_DIR:-/etc/nginx/templates}
suffix=${NGINX_ENVSUBST_TEMPLATE_SUFFIX:-.template}
out=${NGINX_ENVSUBST_OUTPUT_DIR:-/etc/nginx/conf.d}
names=$(awk -v filter="${NGINX_ENVSUBST_FILTER:-}" \
    'END { for (name in ENVIRON) if (name ~ filter) printf "${%s} ", name }' </dev/null)
[ -d "$templates" ] || exit 0
if [ ! -w "$out" ]; then
    echo "$0: ERROR: $templates exists, but $out is not writable"
    exit 0
fi
find "$templates" -follow -type f -name "*$suffix" -print | while read -r template; do
    relative=${template#"$templates/"}
    mkdir -p "$out/$(dirname "$relative")"
    envsubst "$names" <"$template" >"$out/${relative%"$suffix"}"
done
"""


class RenderError(RuntimeError):
    """The image's entrypoint would stop: ``returncode`` and ``stderr`` say why."""

    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(f"rendering nginx's config failed ({returncode}):\n{stderr}")
        self.returncode = returncode
        self.stderr = stderr


def render(env: Mapping[str, str], out_dir: Path) -> Path:
    """Render nginx's config as the image's entrypoint does; returns ``out_dir/nginx.conf``.

    ``env`` is the container's environment (the NGINX_* and SERVING_* settings);
    nothing else from this process's environment but PATH reaches the scripts.
    The output directory is ``out_dir`` whatever ``env`` says, so the pid and
    temp paths land there too and ``nginx -t`` can run on the result.
    Raises ``RenderError`` where the container would refuse to start.
    """
    out_dir = Path(out_dir).resolve()
    full_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **env,
        "NGINX_ENVSUBST_TEMPLATE_DIR": str(TEMPLATES),
        "NGINX_ENVSUBST_OUTPUT_DIR": str(out_dir),
    }
    with tempfile.TemporaryDirectory(prefix="serving-entrypoint-") as tmp:
        # The image's /docker-entrypoint.d: the repo's files beside the base's step.
        entrypoint_d = Path(tmp)
        for source in ENTRYPOINT_D.iterdir():
            (entrypoint_d / source.name).symlink_to(source)
        step = entrypoint_d / "20-envsubst-on-templates.sh"
        step.write_text(ENVSUBST_ON_TEMPLATES)
        step.chmod(0o755)
        result = subprocess.run(
            ["sh", "-c", DOCKER_ENTRYPOINT, "docker-entrypoint.sh", str(entrypoint_d)],
            env=full_env,
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
        conf = render(env, conf_dir)
        log_path = root / "nginx.log"
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
