"""wire: gunicorn's real request parser and response, over a socket pair, counting sends."""

from __future__ import annotations

import socket

import pytest
from gunicorn.config import Config
from gunicorn.http import RequestParser, wsgi

from serving_core.process import wire

wire.install()


class Recording:
    """The server side of the pair, recording each ``sendall``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sends: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.sends.append(bytes(data))
        self.sock.sendall(data)

    def __getattr__(self, name):
        return getattr(self.sock, name)


@pytest.fixture
def exchange():
    client, server = socket.socketpair()
    cfg = Config()

    def respond(request: bytes):
        client.sendall(request)
        req = next(iter(RequestParser(cfg, server, ("127.0.0.1", 4242))))
        recording = Recording(server)
        resp, _ = wsgi.create(req, recording, ("127.0.0.1", 4242), "127.0.0.1:8000", cfg)
        return resp, recording

    yield respond
    client.close()
    server.close()


def wire_text(recording: Recording) -> str:
    return b"".join(recording.sends).decode("latin-1")


def test_the_head_and_the_body_leave_in_one_send(exchange):
    resp, recording = exchange(b"POST /predict HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    resp.start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "2")])
    resp.write(b"{}")
    resp.close()
    assert len(recording.sends) == 1
    head, body = wire_text(recording).split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 200 OK\r\n")
    assert "Content-Length: 2" in head
    assert body == "{}"


def test_a_response_without_body_bytes_still_sends_its_head(exchange):
    resp, recording = exchange(b"HEAD /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    resp.start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "9")])
    resp.close()
    assert len(recording.sends) == 1
    assert wire_text(recording).startswith("HTTP/1.1 200 OK\r\n")
    assert wire_text(recording).endswith("\r\n\r\n")


def test_a_chunked_response_keeps_head_chunks_and_terminator_in_order(exchange):
    resp, recording = exchange(b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n")
    resp.start_response("200 OK", [("Content-Type", "text/plain")])
    resp.write(b"ab")
    resp.write(b"cde")
    resp.close()
    head, body = wire_text(recording).split("\r\n\r\n", 1)
    assert "Transfer-Encoding: chunked" in head
    assert body == "2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"


def test_gunicorns_own_errors_are_json():
    client, server = socket.socketpair()
    try:
        wire.write_json_error(server, 400, "Bad Request", "Invalid HTTP request line: 'x'")
        raw = client.recv(4096).decode()
    finally:
        client.close()
        server.close()
    head, body = raw.split("\r\n\r\n", 1)
    assert head.startswith("HTTP/1.1 400 Bad Request")
    assert "Content-Type: application/json" in head
    assert body == '{"error":{"type":"bad_request","message":"Invalid HTTP request line: \'x\'"}}'
