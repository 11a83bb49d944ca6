"""Slow clients against a real gunicorn (gevent), alone and behind a real nginx.

A slow client sends its headers, with a large Content-Length, and then dribbles
or stalls the body. Without a body deadline and without room kept for new
connections, ~1,000 of them held every connection of a worker, and nobody
else was served.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import gevent
import pytest
import requests
from gevent.event import Event

from serving_core.process.workers import uploads
from tests.conftest import PROBE
from tests.nginx_server import nginx_server
from tests.servers import Server, gunicorn_server, wait_for

HEAD = (
    "POST /predict HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
    "Content-Length: {length}\r\n\r\n"
)
SLOW_CLIENTS = 1000
ONE_WORKER = {"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1"}


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def send_head(url: str, length: int = 1024 * 1024, body: bytes = b'{"text": "') -> socket.socket:
    sock = socket.create_connection(address(url), timeout=30)
    sock.sendall(HEAD.format(length=length).encode() + body)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """The status, headers and JSON body of the response on ``sock``; then it must close."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed without a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "closed mid-response"
        body += chunk
    return int(status_line.split()[1]), headers, json.loads(body)


class SlowClients:
    """``count`` connections that send headers and then stall (even ones) or dribble a
    byte every half second (odd ones), until ``close``; cut ones are opened again."""

    def __init__(self, url: str, count: int) -> None:
        self.url = url
        self.count = count
        self.opened = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._socks: list[socket.socket] = []

    def __enter__(self) -> SlowClients:
        self._thread.start()
        assert self.opened.wait(120), "the slow connections were not all opened"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for sock in self._socks:
            sock.close()

    def holding(self) -> bool:
        """Still holding its connections: not closed, and its thread has not failed."""
        return self._thread.is_alive() and not self._stop.is_set()

    def _open(self) -> socket.socket:
        sock = send_head(self.url)
        sock.setblocking(False)
        return sock

    def _run(self) -> None:
        self._socks = [self._open() for _ in range(self.count)]
        self.opened.set()
        while not self._stop.wait(0.5):
            for index in range(len(self._socks)):
                if self._cut(self._socks[index]):
                    self._socks[index].close()
                    self._socks[index] = self._open()
                if index % 2:
                    with contextlib.suppress(OSError):
                        self._socks[index].send(b"a")

    @staticmethod
    def _cut(sock: socket.socket) -> bool:
        try:
            sock.recv(1, socket.MSG_PEEK)  # an answer (408), or the end
        except BlockingIOError:
            return False  # nothing from the server: still held
        except OSError:
            return True
        return True


def normal_request(url: str) -> int:
    response = requests.post(url + "/predict", json={"text": "normal"}, timeout=30)
    return response.status_code


@contextlib.contextmanager
def served(behind_nginx: bool, overrides: dict[str, str]) -> Iterator[tuple[str, Server]]:
    """The URL clients call (gunicorn's own, or nginx's in front of it), and gunicorn."""
    with gunicorn_server({**ONE_WORKER, **overrides}) as server:
        if not behind_nginx:
            yield server.url, server
            return
        nginx = {
            # The slow clients and the test share 127.0.0.1: no per-address limit.
            "NGINX_CONN_LIMIT_PER_CLIENT": "0",
            # Every slow body is held, none refused: no cap on the bodies nginx
            # spools (they dribble in: a few bytes each on the test's /tmp).
            "NGINX_BODY_SPOOL_BYTES": "0",
            "NGINX_WORKER_CONNECTIONS": "4096",
        }
        with nginx_server(server.bind, nginx) as proxy:
            yield proxy.url, server


@pytest.mark.e2e
@pytest.mark.parametrize("behind_nginx", [False, True], ids=["alone", "behind-nginx"])
def test_a_thousand_slow_bodies_do_not_starve_normal_requests(behind_nginx):
    # A body timeout longer than the test: what keeps the worker serving is that new
    # connections cut the slow ones (alone), or nginx reading bodies first.
    # Nothing else frees a connection: a starved request waits for a slow body's
    # 300 s deadline, past its client's 30 s timeout (only a guard against a hang).
    # How fast it is served is bench/'s to measure, not a test's.
    with served(behind_nginx, {"SERVING_BODY_TIMEOUT_S": "300"}) as (url, server):
        assert normal_request(url) == 200
        with SlowClients(url, SLOW_CLIENTS) as slow:
            answers = [normal_request(url) for _ in range(10)]
            # Answered while the slow clients still held their connections open.
            assert slow.holding()
        assert answers == [200] * 10
        # What kept the worker free: alone, it cut slow connections to make room;
        # behind nginx, it never saw them (nginx reads whole bodies first).
        assert ("connection(s) cut" in server.output()) is not behind_nginx


@pytest.mark.e2e
def test_a_stalled_body_is_a_408_and_the_connection_closes():
    with gunicorn_server({**ONE_WORKER, "SERVING_BODY_TIMEOUT_S": "1"}) as server:
        with send_head(server.url) as sock:
            status, headers, body = read_response(sock)
            assert status == 408
            assert body["error"]["type"] == "request_timeout"
            assert "SERVING_BODY_TIMEOUT_S=1 s" in body["error"]["message"]
            assert headers["connection"] == "close"
            assert sock.recv(1) == b""
        assert normal_request(server.url) == 200


@pytest.mark.e2e
def test_a_dribbled_body_is_a_408_though_every_read_gets_bytes():
    env = {**ONE_WORKER, "SERVING_BODY_TIMEOUT_S": "1"}
    with gunicorn_server(env) as server, send_head(server.url) as sock:
        sock.settimeout(0.2)
        while True:
            with contextlib.suppress(OSError):
                sock.send(b"a")
            try:
                first = sock.recv(65536, socket.MSG_PEEK)
            except TimeoutError:
                continue
            break
        assert first.startswith(b"HTTP/1.1 408 ")
        sock.settimeout(30)
        assert read_response(sock)[0] == 408


@pytest.mark.e2e
def test_a_body_that_arrives_in_time_is_served_whole():
    with gunicorn_server({**ONE_WORKER, "SERVING_BODY_TIMEOUT_S": "30"}) as server:
        text = "x" * 200_000
        body = json.dumps({"text": text}).encode()
        with send_head(server.url, len(body), b"") as sock:
            for start in range(0, len(body), 50_000):
                sock.sendall(body[start : start + 50_000])
                time.sleep(0.05)
            status, _, answer = read_response(sock)
        assert status == 200
        assert answer["text"] == text


@pytest.mark.e2e
def test_a_body_cut_short_by_its_client_is_a_json_400():
    # The client half-closes with 10 of its 100 bytes sent: the server reads to the end.
    with gunicorn_server(ONE_WORKER) as server:
        with send_head(server.url, 100, b'{"text": "') as sock:
            sock.shutdown(socket.SHUT_WR)
            status, _, body = read_response(sock)
        assert status == 400
        assert body["error"]["type"] == "bad_request"
        assert normal_request(server.url) == 200
        assert "Traceback" not in server.output()


@pytest.mark.e2e
def test_a_full_queue_refuses_a_request_before_its_body_is_sent(tmp_path):
    env = {
        **ONE_WORKER,
        "SERVING_MAX_BATCH_SIZE": "1",
        "SERVING_MAX_QUEUE": "1",
        # Only a guard against a hang: the gate, not a deadline, ends the held request.
        "SERVING_REQUEST_TIMEOUT_S": "300",
    }
    with gunicorn_server(env) as server, ThreadPoolExecutor(2) as pool:
        predict = server.url + "/predict"
        try:
            held = pool.submit(requests.post, predict, json={"gate": str(tmp_path)}, timeout=300)
            wait_for((tmp_path / "started").exists, "the held request in the model", 60)
            queued = pool.submit(requests.post, predict, json={"text": "queued"}, timeout=300)
            wait_for(lambda: queue_depth(server.url) == 1, "the second request queued", 60)
            # Headers only: the body never comes, so a refusal must not wait for it.
            with send_head(server.url) as sock:
                status, headers, body = read_response(sock)
        finally:
            (tmp_path / "open").touch()
        assert status == 503
        assert body["error"]["type"] == "overloaded"
        assert "queue is full" in body["error"]["message"]
        assert int(headers["retry-after"]) >= 1
        assert held.result().status_code == 200
        assert queued.result().status_code == 200


def queue_depth(url: str) -> int:
    metadata = requests.get(url + "/metadata", timeout=30).json()
    return int(metadata["batching"]["queue_depth"])


class FakeSocket:
    def __init__(self) -> None:
        self.shut: int | None = None

    def shutdown(self, how: int) -> None:
        self.shut = how


def test_past_the_limit_the_connection_waiting_longest_is_cut_never_a_working_one():
    connections = uploads.Connections(10)  # a tenth kept free: the limit is 9
    assert connections.limit == 9
    release = Event()
    opened: dict[int, uploads.Connection] = {}

    def client(index: int) -> None:
        conn = opened[index] = connections.opened(FakeSocket())
        if index == 0:
            connections.working(conn)  # the app has its request
        if index == 2:
            conn.reading_body = True
        release.wait()
        connections.closed()

    greenlets = []
    for index in range(9):
        greenlets.append(gevent.spawn(client, index))
        gevent.sleep(0)  # each starts before the next: the oldest first
    connections.make_room(9)
    assert [c.cut for c in opened.values()] == [False] * 9
    connections.make_room(10)
    assert [i for i, c in opened.items() if c.cut] == [1]  # not 0: the app works on it
    assert opened[1].sock.shut == socket.SHUT_RDWR
    connections.make_room(10)  # one over, already cut: nobody else
    assert [i for i, c in opened.items() if c.cut] == [1]
    connections.make_room(11)
    assert [i for i, c in opened.items() if c.cut] == [1, 2]
    assert opened[2].sock.shut == socket.SHUT_RD  # a body read: the 408 can still be sent
    release.set()
    gevent.joinall(greenlets, timeout=10)
    assert len(connections) == 0
