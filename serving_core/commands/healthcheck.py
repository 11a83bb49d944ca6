"""``serving-core healthcheck``: ask the local server's health route, over TCP or a unix socket.

A container's HEALTHCHECK runs it: it reads the same ``SERVING_BIND`` as the
server, so it follows a unix-socket bind, and slim images need no curl.
"""

from __future__ import annotations

import http.client
import socket
import sys


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout_s: float) -> None:
        super().__init__("localhost", timeout=timeout_s)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def connection(bind: str, timeout_s: float) -> http.client.HTTPConnection:
    if bind.startswith("unix:"):
        return _UnixConnection(bind[len("unix:") :], timeout_s)
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    # A wildcard bind is reached on loopback.
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return http.client.HTTPConnection(host, int(port), timeout=timeout_s)


def main(bind: str, path: str, timeout_s: float) -> int:
    """0 if ``path`` answered 200; what was seen goes to stdout, or to stderr if not."""
    healthy, seen = ask(bind, path, timeout_s)
    print(f"serving-core: {seen}", file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


def ask(bind: str, path: str, timeout_s: float) -> tuple[bool, str]:
    """(healthy, what was seen): healthy means the route answered 200."""
    conn = connection(bind, timeout_s)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
    except OSError as exc:
        return False, f"{bind}{path}: {exc}"
    finally:
        conn.close()
    return response.status == 200, f"{bind}{path}: {response.status}"
