"""A body over SERVING_MAX_BODY_BYTES is a 413 however it arrives: with a Content-Length,
or chunked (no length known until its end), on either worker class, and through nginx
(whose client_max_body_size counts a chunked body too). A server must never act on a
body cut at the limit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tests.conftest import PROBE
from tests.nginx_server import nginx_server
from tests.servers import gunicorn_server

LIMIT = 1024 * 1024  # the default SERVING_MAX_BODY_BYTES
PIECE = 64 * 1024


def json_of_size(size: int) -> bytes:
    head, tail = b'{"text": "', b'"}'
    return head + b"a" * (size - len(head) - len(tail)) + tail


def pieces(body: bytes) -> Iterator[bytes]:
    # A generator: requests sends it chunked, with no Content-Length.
    for start in range(0, len(body), PIECE):
        yield body[start : start + PIECE]


@pytest.fixture(scope="module", params=["gthread", "gevent"])
def server(request):
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "1",
        "SERVING_WORKER_CLASS": request.param,
        "SERVING_MAX_STRING_CHARS": str(2 * LIMIT),  # the body's limit is the one tested
    }
    with gunicorn_server(env) as running:
        yield running


@pytest.mark.e2e
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_2mb_body_is_413_with_a_length_or_chunked(server, framing):
    body = json_of_size(2 * 1000 * 1000)
    response = requests.post(
        server.url + "/predict",
        data=body if framing == "content-length" else pieces(body),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413, response.text[:300]
    assert response.json()["error"]["type"] == "payload_too_large"
    # The connection is still good for the next request.
    assert requests.get(server.url + "/healthz", timeout=10).status_code == 200


@pytest.mark.e2e
@pytest.mark.parametrize("size", [LIMIT, 1000])
def test_a_chunked_body_within_the_limit_is_served_whole(server, size):
    body = json_of_size(size)
    response = requests.post(
        server.url + "/predict",
        data=pieces(body),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["text"]) == size - len(b'{"text": ""}')


@pytest.mark.e2e
def test_a_chunked_form_over_the_limit_is_413(server):
    form = b"text=" + b"a" * (LIMIT + 10)
    response = requests.post(
        server.url + "/predict",
        data=pieces(form),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=30,
    )
    assert response.status_code == 413, response.text[:300]


@pytest.mark.e2e
def test_a_2mb_chunked_body_is_413_through_nginx_which_never_passes_it_on(server):
    with nginx_server(server.bind) as proxy:
        response = requests.post(
            proxy.url + "/predict",
            data=pieces(json_of_size(2 * 1000 * 1000)),
            headers={"Content-Type": "application/json", "X-Request-ID": "chunked-2mb"},
            timeout=30,
        )
        entry = proxy.access_entry("chunked-2mb")
    assert response.status_code == 413, response.text[:300]
    assert response.json()["error"]["type"] == "payload_too_large"
    assert entry["upstream_addr"] == ""  # refused by nginx: the app never saw it
