"""How a served request's body is read, over raw sockets to a real server on each
worker class: a malformed chunked body is a JSON 400 on every route that reads one,
and ``Expect: 100-continue`` is answered only once the app reads the body, so a body
over SERVING_MAX_BODY_BYTES is refused with a 413 that names the limit before the
client sends it (issue 42, the new user's walk)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.servers import Server, gunicorn_server

pytestmark = pytest.mark.e2e

LIMIT = 2000
V2_INFER = "/v2/models/scaler/infer"


@pytest.fixture(scope="module", params=["gevent", "gthread"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    env = {
        "SERVING_HANDLER": "tests/v2/tensors_handler.py",
        "SERVING_WORKERS": "1",
        "SERVING_WORKER_CLASS": request.param,
        "SERVING_MAX_BODY_BYTES": str(LIMIT),
    }
    with gunicorn_server(env) as running:
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback:\n{log[-4000:]}"


def connect(server: Server) -> socket.socket:
    host, port = server.bind.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_response(sock: socket.socket) -> tuple[str, dict[str, str], bytes]:
    """One response: its status line, its headers (lower-cased names) and its body
    (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"the server closed the connection after {data!r}"
        data += part
    head, rest = data.split(b"\r\n\r\n", 1)
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, value = line.split(":", 1)
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        part = sock.recv(65536)
        assert part, "the server closed the connection inside a body"
        rest += part
    return status, headers, rest[:length]


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (nothing more comes)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def head(path: str, *lines: str) -> bytes:
    return ("\r\n".join([f"POST {path} HTTP/1.1", "Host: test", *lines]) + "\r\n\r\n").encode()


@pytest.mark.parametrize("path", ["/predict", "/jobs", V2_INFER])
@pytest.mark.parametrize(
    ("chunks", "says"),
    [
        (b"ZZ\r\n{}\r\n0\r\n\r\n", "Invalid chunk size"),
        (b"2\r\n{}XX0\r\n\r\n", "Invalid chunk terminator"),
    ],
    ids=["size-not-hex", "no-crlf-after-chunk"],
)
def test_a_malformed_chunked_body_is_a_json_400_naming_it(
    server: Server, path: str, chunks: bytes, says: str
) -> None:
    """A malformed chunk reached the app as gunicorn's parser error: a 500 and a traceback."""
    with connect(server) as sock:
        sock.sendall(
            head(path, "Content-Type: application/json", "Transfer-Encoding: chunked") + chunks
        )
        status, _, body = read_response(sock)
    assert status.startswith("HTTP/1.1 400"), (status, body)
    error = json.loads(body)["error"]
    message = error if path == V2_INFER else error["message"]
    assert message.startswith("the chunked request body is malformed")
    assert says in message


@pytest.mark.parametrize("path", ["/predict", V2_INFER])
def test_an_expected_body_over_the_limit_is_refused_before_100_continue(
    server: Server, path: str
) -> None:
    """gunicorn sent 100 Continue before any app code ran, so the client uploaded the
    body it was about to be refused; and the 413 did not say what the limit is."""
    with connect(server) as sock:
        sock.sendall(
            head(
                path,
                "Content-Type: application/json",
                f"Content-Length: {LIMIT + 1}",
                "Expect: 100-continue",
            )
        )
        status, headers, body = read_response(sock)  # with no byte of the body sent
        assert status.startswith("HTTP/1.1 413"), (status, body)
        assert headers.get("connection") == "close"
        assert closed(sock)
    error = json.loads(body)["error"]
    message = error if path == V2_INFER else error["message"]
    assert f"SERVING_MAX_BODY_BYTES={LIMIT} bytes" in message


def test_an_expected_body_within_the_limit_gets_100_continue_then_its_answer(
    server: Server,
) -> None:
    body = json.dumps({"values": [1, 2, 3]}).encode()
    with connect(server) as sock:
        sock.sendall(
            head(
                "/predict",
                "Content-Type: application/json",
                f"Content-Length: {len(body)}",
                "Expect: 100-continue",
            )
        )
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += sock.recv(1)  # byte by byte: the final response must not be eaten
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        status, _, answer = read_response(sock)
        assert status.startswith("HTTP/1.1 200"), (status, answer)
        assert json.loads(answer)["doubled"] == [2.0, 4.0, 6.0]
        # Kept alive: the connection serves the next request.
        sock.sendall(head("/predict", "Content-Type: application/json", "Content-Length: 2"))
        sock.sendall(b"{}")
        status, _, _ = read_response(sock)
        assert status.startswith("HTTP/1.1 400")


def test_a_chunked_body_over_the_limit_is_a_413_naming_the_limit(server: Server) -> None:
    chunk = b" " * (LIMIT + 10)
    with connect(server) as sock:
        sock.sendall(
            head("/predict", "Content-Type: application/json", "Transfer-Encoding: chunked")
            + f"{len(chunk):x}\r\n".encode()
            + chunk
            + b"\r\n0\r\n\r\n"
        )
        status, _, body = read_response(sock)
    assert status.startswith("HTTP/1.1 413"), (status, body)
    assert f"SERVING_MAX_BODY_BYTES={LIMIT} bytes" in json.loads(body)["error"]["message"]
