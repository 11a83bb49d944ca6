"""nginx's cap on the request bodies it spools to disk at once (NGINX_BODY_SPOOL_BYTES).

A body over NGINX_CLIENT_BODY_BUFFER_SIZE is written to nginx's temp directory
(/tmp in the container) until it has arrived whole. The cap lets through as
many such uploads at once as NGINX_BODY_SPOOL_BYTES holds bodies of
SERVING_MAX_BODY_BYTES, and refuses the next from its headers. Run for real:
a ``serving-core serve`` with the echo handler behind the nginx the image's
entrypoint starts, on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import time
from collections.abc import Iterator

import pytest
import requests

from tests.deploy.test_nginx import ECHO, assert_security_headers, error_of, json_body_of_size
from tests.nginx_server import Nginx, nginx_server
from tests.servers import gunicorn_server, wait_for

MAX_BODY = 65536
LIMITS = {
    "SERVING_MAX_BODY_BYTES": str(MAX_BODY),
    "SERVING_REQUEST_TIMEOUT_S": "10",
    "SERVING_KEEPALIVE_S": "5",
}
NGINX_ENV = {
    **LIMITS,
    # Bodies over 1 KiB are spooled; room for two of the largest at once.
    "NGINX_CLIENT_BODY_BUFFER_SIZE": "1k",
    "NGINX_BODY_SPOOL_BYTES": str(2 * MAX_BODY),
    # Off, so that only the spool cap can refuse; held uploads stay open.
    "NGINX_CONN_LIMIT_PER_CLIENT": "0",
    "NGINX_CLIENT_TIMEOUT_S": "60",
}
# A prediction the echo handler answers, over the buffer and within the limit.
LARGE = json_body_of_size(MAX_BODY - 1000)
# What a held upload sends of its body: past the 1 KiB buffer, so nginx has
# opened its temp file, and short of the whole, so nginx keeps waiting.
HELD = 4096
# nginx's warning (at the default warn level) when it opens a body's temp file.
SPOOLED = "a client request body is buffered to a temporary file"


@contextlib.contextmanager
def held_upload(port: int) -> Iterator[socket.socket]:
    """A LARGE prediction whose headers and first HELD bytes are sent: nginx is spooling it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(LARGE)}\r\n\r\n".encode()
            + LARGE[:HELD]
        )
        yield sock


def finish(sock: socket.socket) -> http.client.HTTPResponse:
    """Send the rest of a held upload's body and read nginx's answer."""
    sock.sendall(LARGE[HELD:])
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    answer.read()
    return answer


def post_large(proxy: Nginx) -> requests.Response:
    return requests.post(
        proxy.url + "/predict",
        data=LARGE,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )


def large_accepted(proxy: Nginx, timeout_s: float = 15.0) -> requests.Response:
    """Posts LARGE until it is not refused: nginx frees a finished upload's
    place just after it has sent the answer, so the next may still find it taken."""
    deadline = time.monotonic() + timeout_s
    while (response := post_large(proxy)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.02)
    return response


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_large_bodies_beyond_the_spool_cap_get_json_429_while_small_ones_pass() -> None:
    app_env = {"SERVING_HANDLER": ECHO, "SERVING_WORKERS": "1", **LIMITS}
    with (
        gunicorn_server(app_env) as app,
        nginx_server(app.bind, NGINX_ENV) as proxy,
        held_upload(proxy.port) as first,
        held_upload(proxy.port) as second,
    ):
        # Both bodies are in nginx's temp files: the cap's two places are taken.
        wait_for(lambda: proxy.output().count(SPOOLED) == 2, lambda: proxy.output()[-2000:])
        refused = post_large(proxy)
        small = requests.post(proxy.url + "/predict", json={"text": "small"}, timeout=30)
        # One held upload completes; the other still holds its place.
        finished = finish(first)
        accepted = large_accepted(proxy)
        log = proxy.output()
        # The other was held all along, and completes too.
        last = finish(second)

    assert refused.status_code == 429
    error = error_of(refused)
    assert error["type"] == "too_many_requests"
    assert f"NGINX_BODY_SPOOL_BYTES ({2 * MAX_BODY}" in error["message"]
    assert "raise NGINX_BODY_SPOOL_BYTES together with the size of /tmp" in error["message"]
    assert refused.headers["Retry-After"] == "1"
    assert_security_headers(refused)
    assert 'limiting connections by zone "serving_body_spool"' in log
    # The refused body was never spooled: still only the two held ones, then
    # the finished one's successor.
    assert log.count(SPOOLED) == 3

    assert small.status_code == 200  # a body nginx keeps in memory is not counted
    assert finished.status == 200
    assert accepted.status_code == 200
    assert accepted.json() == {"echo": {"text": "a" * (len(LARGE) - len(b'{"text": ""}'))}}
    assert last.status == 200
