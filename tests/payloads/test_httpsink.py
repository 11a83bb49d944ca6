"""The HTTP sink against a real HTTP server on 127.0.0.1: each event POSTed as
``application/cloudevents+json``, a URL's credentials as basic authentication, and an
endpoint that refuses or is not there counts the events failed."""

from __future__ import annotations

import base64
import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

from serving_core.payloads.event import Origin
from serving_core.payloads.logger import PayloadLog
from serving_core.payloads.sampler import Sampler
from tests.payloads.recorder import Counts
from tests.servers import free_port, wait_for


class Receiver(ThreadingHTTPServer):
    """Keeps every POST (path, headers, body); answers ``status``."""

    status = 202

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posts: list[tuple[str, dict[str, str], bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.server.posts.append((self.path, headers, body))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:  # quiet
        pass


@contextlib.contextmanager
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def log_to(url: str, counts: Counts) -> PayloadLog:
    return PayloadLog(url, origin=Origin("m", "1", "r"), sampler=Sampler(1.0), observer=counts)


def test_each_event_is_posted_as_a_structured_cloudevent():
    counts = Counts()
    with receiver() as server:
        log = log_to(server.url + "/events", counts)
        log.start()
        try:
            log.offer("r1", {"text": "a", "token": "t"}, {"label": "x"})
            log.offer("r2", {"text": "b"}, {"label": "y"})
            wait_for(lambda: counts["sent"] == 2, "both events posted")
        finally:
            log.stop()
        posts = list(server.posts)
    assert [path for path, _, _ in posts] == ["/events", "/events"]
    for _, headers, _ in posts:
        assert headers["content-type"] == "application/cloudevents+json"
        assert "authorization" not in headers
    first = orjson.loads(posts[0][2])
    assert first["specversion"] == "1.0"
    assert first["requestid"] == "r1"
    assert first["data"] == {
        "request": {"text": "a", "token": "[redacted]"},
        "response": {"label": "x"},
    }


def test_a_urls_credentials_are_sent_as_basic_authentication():
    counts = Counts()
    with receiver() as server:
        log = log_to(server.url.replace("http://", "http://collector:s3cret@") + "/in", counts)
        log.start()
        try:
            log.offer("r1", {"text": "a"}, {"label": "x"})
            wait_for(lambda: counts["sent"] == 1, "the event posted")
        finally:
            log.stop()
        [(path, headers, _)] = server.posts
    assert path == "/in"
    assert headers["authorization"] == "Basic " + base64.b64encode(b"collector:s3cret").decode()


@pytest.mark.parametrize("status", [400, 500, 503])
def test_an_endpoint_that_refuses_counts_the_event_failed(status):
    counts = Counts()
    with receiver() as server:
        server.status = status
        log = log_to(server.url, counts)
        log.start()
        try:
            log.offer("r1", {"text": "a"}, {"label": "x"})
            wait_for(lambda: counts["failed"] == 1, "the refused event counted")
        finally:
            log.stop()
    assert counts["sent"] == 0


def test_an_endpoint_not_there_counts_the_event_failed_and_the_log_stops_at_once():
    counts = Counts()
    log = log_to(f"http://127.0.0.1:{free_port()}/events", counts)
    log.start()
    log.offer("r1", {"text": "a"}, {"label": "x"})
    wait_for(lambda: counts["failed"] == 1, "the event counted failed")
    log.offer("r2", {"text": "b"}, {"label": "y"})
    log.stop(timeout_s=30)
    assert counts["failed"] + counts["dropped"] == 2
