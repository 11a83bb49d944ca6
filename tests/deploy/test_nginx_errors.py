"""nginx's own error answers and error log, through the shipped configuration (issue 42).

- **L6.** A job's id is the key to its result: the access logs keep its first 8
  characters only, and nginx's error log, whose lines quote the request line,
  must not carry it either.
- **I2.** A ``%00`` in the URI is the JSON 400 of nginx's other refusals, never
  nginx's HTML page.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from tests.nginx_server import Nginx, nginx_server
from tests.servers import free_port, gunicorn_server, wait_for

ECHO = "handlers/echo/handler.py"
JOB_ID = "6f0e9a8b7c6d5e4f3a2b1c0d9e8f7a6b"  # the form of a job id: uuid4's hex


@pytest.fixture(scope="module")
def dead_upstream() -> Iterator[Nginx]:
    """nginx in front of a port nothing listens on: every proxied request is an error
    nginx logs, with its request line."""
    with nginx_server(f"127.0.0.1:{free_port()}") as proxy:
        yield proxy


def get(nginx: Nginx, target: str) -> tuple[int, str, bytes]:
    """``GET target`` as sent, unnormalised (requests would re-encode it)."""
    connection = http.client.HTTPConnection("127.0.0.1", nginx.port, timeout=10)
    try:
        connection.putrequest("GET", target, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


@pytest.mark.e2e
@pytest.mark.parametrize(
    "target",
    [f"/jobs/{JOB_ID}", f"/jobs/{JOB_ID}?wait=1", f"//jobs/{JOB_ID}", f"/x/../jobs/{JOB_ID}"],
)
def test_l6_nginx_error_log_never_holds_a_job_id_in_full(dead_upstream: Nginx, target: str) -> None:
    # An error nginx logs for any proxied request: the upstream refused the connection.
    start = len(dead_upstream.output())
    status, _, _ = get(dead_upstream, "/predict?before")
    assert status == 502
    wait_for(lambda: "/predict?before" in dead_upstream.output()[start:], "the error's line")
    status, content_type, _ = get(dead_upstream, target)
    assert (status, content_type) == (502, "application/json")
    # nginx writes an error's line before it answers: by the 502, it would be there.
    log = dead_upstream.output()[start:]
    assert JOB_ID[8:] not in log, log


@pytest.fixture(scope="module")
def echo_behind_nginx() -> Iterator[Nginx]:
    app_env = {"SERVING_HANDLER": ECHO, "SERVING_WORKERS": "1"}
    with gunicorn_server(app_env) as app, nginx_server(app.bind) as proxy:
        yield proxy


@pytest.mark.e2e
@pytest.mark.example("echo")
@pytest.mark.parametrize(
    "target",
    # Request lines nginx refuses itself, before it has a URI.
    ["/predict%00", "/jobs/%00", "/%00", "/v2/models/echo%00/ready", "/a%", "/..%2f..%2f"],
)
def test_i2_a_nul_in_the_uri_is_nginxs_json_400(echo_behind_nginx: Nginx, target: str) -> None:
    status, content_type, body = get(echo_behind_nginx, target)
    assert status == 400, (status, body[:300])
    assert content_type == "application/json", body[:300]
    assert json.loads(body)["error"]["type"] == "bad_request"


@pytest.mark.e2e
@pytest.mark.example("echo")
def test_a_uri_over_nginxs_buffers_is_its_json_414(echo_behind_nginx: Nginx) -> None:
    status, content_type, body = get(echo_behind_nginx, "/" + "a" * 9000)
    assert (status, content_type) == (414, "application/json"), body[:300]
    assert json.loads(body)["error"]["type"] == "uri_too_long"
