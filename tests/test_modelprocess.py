"""The shared model process without a server: a forked model process, and clients in threads."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from serving_core.context import Context
from serving_core.engine import Engine
from serving_core.errors import DeadlineExceeded, NotReady, Overloaded
from serving_core.loading import load_handler
from serving_core.modelprocess import ModelProcess, RemoteBatcher, socket_path
from serving_core.settings import Settings

SHARED = str(Path(__file__).parent / "handlers/shared/handler.py")
WAIT_S = 30.0  # a bound on waiting for an event, never an expected time


@pytest.fixture
def model() -> Iterator[tuple[ModelProcess, Engine]]:
    settings = Settings.from_env(
        {"SERVING_HANDLER": SHARED, "SERVING_WORKERS": "2", "SERVING_MAX_BATCH_SIZE": "8"}
    )
    loaded = load_handler(SHARED)
    loaded.handler.setup()
    engine = Engine(loaded.handler, max_batch_size=settings.max_batch_size)
    with tempfile.TemporaryDirectory(prefix="serving-model-") as tmp:
        process = ModelProcess(settings, engine, path=socket_path(tmp), sample=loaded.sample)
        process.start()
        try:
            yield process, engine
        finally:
            process.stop()


def client(process: ModelProcess, open_connections: int | None = None) -> RemoteBatcher:
    remote = RemoteBatcher(process.path, open_connections=lambda: open_connections)
    remote.start()
    assert remote.wait_connected(WAIT_S), "never connected to the model process"
    return remote


def ask(
    remote: RemoteBatcher, engine: Engine, params: dict[str, Any], timeout_s: float = WAIT_S
) -> Any:
    ctx = Context(f"r-{params.get('text')}", time.monotonic() + timeout_s)
    pending = remote.submit(engine.prepare(params, ctx), ctx, arrival=time.monotonic())
    return engine.finish(pending.future.result(WAIT_S), params, ctx)


def test_two_clients_share_one_model_process_and_its_batches(model):
    process, engine = model
    first, second = client(process, 8), client(process, 8)
    # The first request holds the model while the rest queue up behind it.
    with ThreadPoolExecutor(16) as pool:
        blocker = pool.submit(ask, first, engine, {"text": "hold", "sleep_s": 0.5})
        time.sleep(0.1)
        futures = [
            pool.submit(ask, remote, engine, {"text": f"{name}-{i}"})
            for i in range(6)
            for name, remote in (("a", first), ("b", second))
        ]
        answers = [f.result() for f in futures]
    assert blocker.result()["size"] == 1
    assert {a["model_pid"] for a in answers} == {process.pid}
    assert process.pid != os.getpid()
    by_batch: dict[int, set[str]] = {}
    for answer in answers:
        by_batch.setdefault(answer["batch"], set()).add(answer["text"][0])
    assert any(senders == {"a", "b"} for senders in by_batch.values()), by_batch
    assert [a["text"] for a in answers] == [f"{n}-{i}" for i in range(6) for n in "ab"]
    for remote in (first, second):
        assert remote.stop(5)
        assert remote.depth == 0


def test_answers_equal_the_per_worker_engine(model):
    process, engine = model
    remote = client(process)
    params = {"text": "same"}
    shared = ask(remote, engine, params)
    here = engine.finish(
        engine.run([engine.prepare(params, Context("x"))], [Context("x")]).results[0],
        params,
        Context("x"),
    )
    assert {k: v for k, v in shared.items() if k not in ("batch", "model_pid")} == {
        k: v for k, v in here.items() if k not in ("batch", "model_pid")
    }
    remote.stop(5)


def test_a_request_past_its_deadline_in_the_model_process_is_a_504(model):
    process, engine = model
    remote = client(process)
    with ThreadPoolExecutor(2) as pool:
        blocker = pool.submit(ask, remote, engine, {"text": "hold", "sleep_s": 0.5})
        time.sleep(0.1)
        ctx = Context("late", time.monotonic() + 0.2)
        pending = remote.submit(
            engine.prepare({"text": "late"}, ctx), ctx, arrival=time.monotonic()
        )
        with pytest.raises((DeadlineExceeded, Overloaded)) as refused:
            pending.future.result(WAIT_S)
        blocker.result()
    # Refused at admission (predicted late) or dropped at its deadline: 503 or 504.
    assert refused.value.status in (503, 504)
    remote.stop(5)


def test_a_killed_model_process_fails_requests_in_flight_and_is_replaced(model):
    process, engine = model
    remote = client(process)
    ctx = Context("in-flight", time.monotonic() + WAIT_S)
    held = remote.submit(
        engine.prepare({"text": "x", "sleep_s": 5}, ctx), ctx, arrival=time.monotonic()
    )
    time.sleep(0.2)
    killed = process.pid
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(NotReady, match="stopped while this request was in it"):
        held.future.result(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while not (remote.alive and process.pid != killed):
        assert time.monotonic() < deadline, "no new model process"
        time.sleep(0.02)
    answer = ask(remote, engine, {"text": "after"})
    assert answer["model_pid"] == process.pid != killed
    remote.stop(5)


def test_without_a_model_process_submit_is_not_ready_at_once():
    remote = RemoteBatcher("/nonexistent/model.sock")
    remote.start()
    ctx = Context("x", time.monotonic() + 1)
    started = time.monotonic()
    with pytest.raises(NotReady, match="retry after /readyz"):
        remote.submit({"text": "x"}, ctx, arrival=started)
    assert not remote.alive
    remote.stop(0)


def test_many_threads_through_one_connection_each_get_their_own_answer(model):
    process, engine = model
    remote = client(process)
    lock = threading.Lock()
    wrong: list[tuple[str, Any]] = []

    def one(i: int) -> None:
        answer = ask(remote, engine, {"text": f"t{i}"})
        if answer["text"] != f"t{i}":
            with lock:
                wrong.append((f"t{i}", answer))

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(400)))
    assert not wrong
    remote.stop(5)
