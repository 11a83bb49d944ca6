"""Debian's real redis-server on 127.0.0.1, for the cache's end-to-end tests.

Each server has a free port, a temporary directory and no persistence, and
is stopped (by its process group) when its ``with`` block ends, whatever
happens inside it.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.servers import free_port, require_marker, stop

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@contextlib.contextmanager
def redis_server(
    *,
    ready_timeout_s: float = 15.0,
    options: Sequence[str] = (),
    data_dir: Path | None = None,
    port: int | None = None,
) -> Iterator[str]:
    """Run redis-server on a free port; yields its URL (``redis://127.0.0.1:PORT/0``).

    ``options`` come last, so they override the defaults (``--appendonly yes``).
    ``data_dir``: its files there, for a server started again on what one left
    (``port``: on the port the last one had, so that its clients find it again)."""
    require_marker("e2e", "redis-server")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="serving-redis-") as own:
        tmp = str(data_dir or own)
        log_path = Path(tmp) / "redis.log"
        # No persistence: nothing is written to tmp but the log.
        command = [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(port), "--dir", tmp]
        command += ["--save", "", "--appendonly", "no", "--daemonize", "no", *options]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_ready(process, port, log_path, ready_timeout_s)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            stop(process)


def _wait_ready(
    process: subprocess.Popen[bytes], port: int, log_path: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"redis-server exited with {process.returncode}:\n"
                + log_path.read_text(errors="replace")
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as s:
            s.sendall(b"PING\r\n")
            # NOAUTH: a server started with --requirepass answers, so it is up.
            if s.recv(16).startswith((b"+PONG", b"-NOAUTH")):
                return
        time.sleep(0.02)
    raise RuntimeError(
        f"redis-server not ready after {timeout_s} s:\n" + log_path.read_text(errors="replace")
    )
