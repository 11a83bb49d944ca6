"""What crosses a model socket: many requests, or a batch's answers, in one frame.

A worker's burst of requests goes as few frames (``link.FRAME_REQUESTS`` at most
each); the model process answers a batch's items for one connection in one
frame; one message pickle cannot carry fails alone, not its frame.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.errors import Overloaded
from serving_core.modelprocess.client import RemoteBatcher
from serving_core.modelprocess.link import FRAME_REQUESTS
from serving_core.modelprocess.protocol import Answer, Frames, Request, frame
from serving_core.modelprocess.supervisor import ModelProcess
from tests.modelprocess.test_modelprocess import WAIT_S, ask, client, running


@pytest.fixture
def model() -> Iterator[tuple[ModelProcess, Engine]]:
    with running(1) as ([process], engine):
        yield process, engine


def test_frames_come_whole_from_any_pieces_of_the_stream():
    first = [Request(1, "a", None, 0.0, {"x": 1}, 3)]
    second = [Answer(2, {"y": [1.5] * 100}, None, 4), Answer(3, None, None, 0)]
    stream = frame(first) + frame(second)
    for size in (1, 3, 7, len(stream)):  # byte by byte, odd pieces, all at once
        frames = Frames()
        got: list[list[Any]] = []
        for start in range(0, len(stream), size):
            got += frames.feed(stream[start : start + size])
        assert got == [first, second]


def test_a_length_no_model_connection_sends_ends_it():
    with pytest.raises(EOFError, match="not a model connection"):
        Frames().feed(b"\xff\xff\xff\xffrest")


@contextlib.contextmanager
def listening() -> Iterator[tuple[str, socket.socket]]:
    with tempfile.TemporaryDirectory(prefix="serving-frames-") as tmp:
        path = str(Path(tmp) / "model.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        try:
            yield path, listener
        finally:
            listener.close()


def test_a_burst_of_requests_crosses_in_frames_of_many_and_one_frame_answers_them():
    with listening() as (path, listener):
        remote = RemoteBatcher(path)
        remote.start()
        conn, _ = listener.accept()
        assert remote.wait_connected(WAIT_S)
        count = 3 * FRAME_REQUESTS + 2
        pendings = []
        for i in range(count):
            ctx = Context(f"r{i}", time.monotonic() + WAIT_S)
            pendings.append(remote.submit({"i": i}, ctx, arrival=time.monotonic()))
        frames, requests = Frames(), []
        sizes = []
        while len(requests) < count:
            data = conn.recv(1 << 16)
            assert data, "the link closed"
            for got in frames.feed(data):
                sizes.append(len(got))
                requests += got
        assert [r.item for r in requests] == [{"i": i} for i in range(count)]
        assert max(sizes) <= FRAME_REQUESTS
        assert len(sizes) < count  # not a frame each
        conn.sendall(frame([Answer(r.seq, {"o": r.item["i"]}, None, count) for r in requests]))
        assert [p.future.result(WAIT_S) for p in pendings] == [{"o": i} for i in range(count)]
        assert {p.batch_size for p in pendings} == {count}
        conn.close()
        remote.stop(1)


def connected(path: str) -> socket.socket:
    """A raw connection to the model process, once it listens (after its warm-up)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            assert time.monotonic() < deadline, "the model process never listened"
            time.sleep(0.05)


def test_the_model_process_answers_a_batchs_items_of_one_connection_in_one_frame(model):
    process, engine = model
    sock = connected(process.path)
    count = 6  # under the batch size (8); every open connection has sent
    requests = []
    for i in range(count):
        ctx = Context(f"f{i}", time.monotonic() + WAIT_S)
        item = engine.prepare({"text": f"f{i}"}, ctx)
        requests.append(Request(i, ctx.request_id, ctx.deadline, time.monotonic(), item, count))
    sock.sendall(frame(requests))
    frames: list[list[Answer]] = []
    reader = Frames()
    sock.settimeout(WAIT_S)
    while sum(map(len, frames)) < count:
        data = sock.recv(1 << 16)
        assert data, "the model process closed the connection"
        frames += reader.feed(data)
    sock.close()
    assert len(frames) == 1
    [answers] = frames
    assert sorted(a.seq for a in answers) == list(range(count))
    assert {a.output["batch"] for a in answers} == {answers[0].output["batch"]}
    assert {a.batch_size for a in answers} == {count}


def test_a_request_pickle_cannot_carry_fails_alone_and_its_frame_goes(model):
    process, engine = model
    remote = client(process)
    pendings = []
    for i in range(FRAME_REQUESTS):  # the last fills the frame: all of them in it
        ctx = Context(f"p{i}", time.monotonic() + WAIT_S)
        item = engine.prepare({"text": f"p{i}"}, ctx)
        if i == 3:
            item = {"text": "p3", "lock": threading.Lock()}
        pendings.append(remote.submit(item, ctx, arrival=time.monotonic()))
    for i, pending in enumerate(pendings):
        if i == 3:
            with pytest.raises((TypeError, pickle.PicklingError)):
                pending.future.result(WAIT_S)
        else:
            assert pending.future.result(WAIT_S)["text"] == f"p{i}"
    assert ask(remote, engine, {"text": "next"})["text"] == "next"
    remote.stop(5)


def test_a_burst_past_the_model_processs_queue_is_refused_in_part_and_the_rest_answered(model):
    process, engine = model
    remote = client(process)
    hold_ctx = Context("hold", time.monotonic() + WAIT_S)
    held = remote.submit(
        engine.prepare({"text": "hold", "sleep_s": 0.5}, hold_ctx), hold_ctx, arrival=0.0
    )
    time.sleep(0.1)  # the batch of one runs; the burst queues behind it
    # SERVING_MAX_QUEUE (2 x 8 by default) per worker, 2 workers: 32 in the model process.
    pendings = []
    for i in range(48):
        ctx = Context(f"q{i}", time.monotonic() + WAIT_S)
        pendings.append(
            remote.submit(engine.prepare({"text": f"q{i}"}, ctx), ctx, arrival=time.monotonic())
        )
    answered, refusals = 0, []
    for pending in pendings:
        try:
            pending.future.result(WAIT_S)
            answered += 1
        except Overloaded as error:
            refusals.append(error)
    assert held.future.result(WAIT_S)["text"] == "hold"
    assert {(e.reason, e.retry_after_s is not None) for e in refusals} == {("queue_full", True)}
    # 32 queued (31, had the held one not been taken yet); the rest refused at once.
    assert answered + len(refusals) == 48
    assert len(refusals) >= 16
    remote.stop(5)
