"""The shared model process without a server: a forked model process, and clients in threads."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests

from serving_core.context import Context
from serving_core.device import model_devices
from serving_core.engine.engine import Engine
from serving_core.errors import BadGateway, DeadlineExceeded, ModelError, NotReady, Overloaded
from serving_core.loading import load_handler
from serving_core.modelprocess.client import RemoteBatcher
from serving_core.modelprocess.protocol import socket_path
from serving_core.modelprocess.supervisor import ModelProcess
from serving_core.settings import Settings
from tests.conftest import HANDLERS
from tests.servers import ROOT, gunicorn_server, wait_for

SHARED = str(HANDLERS / "shared/handler.py")
WAIT_S = 30.0  # a bound on waiting for an event, never an expected time


@contextlib.contextmanager
def running(count: int) -> Iterator[tuple[list[ModelProcess], Engine]]:
    """``count`` model processes of one server over the shared handler, as with that
    many GPUs (here all on the CPU: device cpu-0, cpu-1 ...)."""
    settings = Settings.from_env(
        {"SERVING_HANDLER": SHARED, "SERVING_WORKERS": "2", "SERVING_MAX_BATCH_SIZE": "8"}
    )
    loaded = load_handler(SHARED)
    loaded.handler.setup()
    engine = Engine(loaded.handler, max_batch_size=settings.max_batch_size)
    with tempfile.TemporaryDirectory(prefix="serving-model-") as tmp:
        processes = [
            ModelProcess(
                settings,
                engine,
                path=socket_path(tmp, i),
                sample=loaded.sample,
                device=f"cpu-{i}" if count > 1 else None,
                processes=count,
            )
            for i in range(count)
        ]
        for process in processes:
            process.start()
        try:
            yield processes, engine
        finally:
            for process in processes:
                process.stop()


@pytest.fixture
def model() -> Iterator[tuple[ModelProcess, Engine]]:
    with running(1) as ([process], engine):
        yield process, engine


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


def test_an_error_raised_in_the_model_process_reaches_the_worker_as_raised(model):
    process, engine = model
    remote = client(process)
    with pytest.raises(BadGateway) as failed:
        ask(remote, engine, {"text": "x", "down": "embed"})
    error = failed.value
    # The handler's own class (its __init__ takes other arguments), with every field.
    assert type(error).__name__ == "StageDown"
    assert (error.message, error.details, error.retry_after_s) == (
        "stage 'embed' is down",
        {"stage": "embed"},
        3.0,
    )
    assert (error.stage, error.attempts) == ("embed", 2)
    assert ask(remote, engine, {"text": "next"})["text"] == "next"
    remote.stop(5)


def test_an_output_pickle_cannot_carry_is_a_model_error_and_the_connection_lives_on(model):
    process, engine = model
    remote = client(process)
    with pytest.raises(ModelError, match="the shared model process failed"):
        ask(remote, engine, {"text": "x", "unpicklable": True})
    assert ask(remote, engine, {"text": "next"})["text"] == "next"
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


@pytest.fixture
def two_models() -> Iterator[tuple[list[ModelProcess], Engine]]:
    with running(2) as models:
        yield models


def test_requests_are_spread_over_every_model_process_and_survive_one_dying(two_models):
    processes, engine = two_models
    remote = RemoteBatcher([p.path for p in processes])
    remote.start()
    assert remote.wait_connected(WAIT_S)
    assert remote.alive
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(lambda i: ask(remote, engine, {"text": f"s{i}", "sleep_s": 0.02}), range(64))
        )
    assert {a["model_pid"] for a in answers} == {p.pid for p in processes}
    # Each ran on its own device: the handler's self.device, set in the child.
    assert {a["device"] for a in answers} == {"cpu-0", "cpu-1"}
    killed = processes[0].pid
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + WAIT_S
    while remote.alive:  # one model process down: this worker is not ready
        assert time.monotonic() < deadline, "still ready with a model process down"
        time.sleep(0.01)
    # ... but what reaches it is served by the other one meanwhile.
    assert ask(remote, engine, {"text": "meanwhile"})["model_pid"] == processes[1].pid
    while not (remote.alive and processes[0].pid != killed):
        assert time.monotonic() < deadline, "the killed model process was not replaced"
        time.sleep(0.02)
    remote.stop(5)


def test_model_devices_give_each_gpu_its_process():
    four = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert model_devices("cuda", 0, four) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert model_devices("cuda", 2, four) == ["cuda:0", "cuda:1"]
    assert model_devices("cuda", 6, {"CUDA_VISIBLE_DEVICES": "3,5"}) == [
        "cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0", "cuda:1",
    ]  # fmt: skip
    assert model_devices("cuda:1", 0, four) == ["cuda:1"]  # one named GPU: one process
    assert model_devices("cuda", 0, {"CUDA_VISIBLE_DEVICES": ""}) == ["cuda"]  # none visible
    assert model_devices("cpu", 0, four) == ["cpu"]
    assert model_devices("cpu", 3, four) == ["cpu", "cpu", "cpu"]


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


# -- through gunicorn -----------------------------------------------------------------

MINILM = str(ROOT / "handlers/minilm")


def shared_env(**extra: str) -> dict[str, str]:
    return {
        "SERVING_HANDLER": SHARED,
        "SERVING_MODEL_PROCESS": "shared",
        "SERVING_WORKERS": "2",
        "SERVING_CACHE_SIZE": "0",
        **extra,
    }


def post_many(url: str, bodies: list[dict[str, Any]]) -> list[requests.Response]:
    """Each on its own connection, all at once, so that both workers take some."""

    def one(body: dict[str, Any]) -> requests.Response:
        return requests.post(url + "/predict", json=body, timeout=WAIT_S)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


@pytest.mark.e2e
def test_two_gunicorn_workers_feed_one_model_process_whose_batches_mix_them():
    with gunicorn_server(shared_env()) as server:
        mixed: dict[int, set[int]] = {}
        for attempt in range(5):  # which worker takes a connection is the kernel's choice
            bodies = [{"text": "hold", "sleep_s": 0.3}] + [
                {"text": f"r{attempt}-{i}"} for i in range(24)
            ]
            with ThreadPoolExecutor(1) as first:
                blocker = first.submit(post_many, server.url, bodies[:1])
                time.sleep(0.1)
                answers = [r.json() for r in post_many(server.url, bodies[1:])]
                blocker.result()
            assert all(a["text"] == f"r{attempt}-{i}" for i, a in enumerate(answers))
            model_pids = {a["model_pid"] for a in answers}
            workers = {a["worker_pid"] for a in answers}
            assert len(model_pids) == 1
            assert not model_pids & workers  # the model ran in neither worker
            for answer in answers:
                mixed.setdefault(answer["batch"], set()).add(answer["worker_pid"])
            if any(len(senders) == 2 for senders in mixed.values()):
                break
        assert any(len(senders) == 2 for senders in mixed.values()), mixed
        metadata = requests.get(server.url + "/metadata", timeout=WAIT_S).json()
        assert metadata["batching"]["model_process"] == "shared"


@pytest.mark.e2e
def test_two_model_processes_under_gunicorn_share_the_requests():
    with gunicorn_server(shared_env(SERVING_MODEL_PROCESSES="2")) as server:
        bodies = [{"text": f"m{i}", "sleep_s": 0.02} for i in range(40)]
        answers = [r.json() for r in post_many(server.url, bodies)]
        assert [a["text"] for a in answers] == [b["text"] for b in bodies]
        assert len({a["model_pid"] for a in answers}) == 2
        metadata = requests.get(server.url + "/metadata", timeout=WAIT_S).json()
        assert metadata["batching"]["model_processes"] == 2


@pytest.mark.e2e
def test_a_sigkilled_model_process_is_replaced_and_the_service_recovers():
    with gunicorn_server(shared_env()) as server:
        before = requests.post(server.url + "/predict", json={"text": "a"}, timeout=WAIT_S)
        killed = before.json()["model_pid"]
        os.kill(killed, signal.SIGKILL)
        statuses: list[int] = []
        deadline = time.monotonic() + WAIT_S
        while True:
            response = requests.post(server.url + "/predict", json={"text": "b"}, timeout=WAIT_S)
            statuses.append(response.status_code)
            if response.status_code == 200:
                break
            assert response.status_code == 503, response.text
            assert response.json()["error"]["type"] == "not_ready"
            assert time.monotonic() < deadline, "the model process was not replaced"
            time.sleep(0.05)
        assert response.json()["model_pid"] != killed
        # The worker that answered has reconnected; the other one may be a poll behind.
        wait_for(
            lambda: requests.get(server.url + "/readyz", timeout=WAIT_S).status_code == 200,
            "/readyz to answer 200 again",
            WAIT_S,
        )
        assert server.process.poll() is None  # the master lives on
        assert "exited; starting another" in server.output()


@pytest.mark.e2e
def test_a_sigterm_to_the_whole_group_keeps_the_model_process_through_the_drain():
    with gunicorn_server(shared_env(SERVING_DRAIN_S="3")) as server:
        session = requests.Session()
        first = session.post(server.url + "/predict", json={"text": "a"}, timeout=WAIT_S)
        model_pid = first.json()["model_pid"]
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(post_many, server.url, [{"text": "in flight", "sleep_s": 1.0}])
            time.sleep(0.3)
            # As a terminal, docker's process group or tests/servers.stop would: the
            # model process ignores it, and serves the workers while they drain.
            os.killpg(server.process.pid, signal.SIGTERM)
            [answer] = slow.result()
            assert answer.status_code == 200, answer.text
            assert answer.json()["text"] == "in flight"
            # Sent during the drain (the workers still accept): the model answers.
            during = session.post(server.url + "/predict", json={"text": "b"}, timeout=WAIT_S)
            assert during.status_code == 200, during.text
            assert during.json()["model_pid"] == model_pid
        server.process.wait(WAIT_S)
    # Nothing of the server's process group is left: no model process (the first
    # one, or one forked again after it) outlives its master.
    deadline = time.monotonic() + WAIT_S
    while _group_alive(server.process.pid):
        assert time.monotonic() < deadline, "a model process outlived its master"
        time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.example("minilm")
@pytest.mark.e2e
@pytest.mark.model
def test_minilm_answers_in_shared_mode_equal_the_per_worker_modes():
    texts = [{"text": f"sentence number {i} about serving models"} for i in range(6)]
    embeddings = {}
    for mode in ("per-worker", "shared"):
        env = {"SERVING_HANDLER": MINILM, "SERVING_MODEL_PROCESS": mode, "SERVING_WORKERS": "2"}
        with gunicorn_server(env) as server:
            answers = post_many(server.url, texts)
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            embeddings[mode] = np.array([r.json()["embedding"] for r in answers])
    assert np.allclose(embeddings["per-worker"], embeddings["shared"], atol=1e-5)
