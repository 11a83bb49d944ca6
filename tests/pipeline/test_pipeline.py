"""Pipelines end to end: real gunicorn processes for every stage and for the pipeline."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from serving_core.pipeline import pipeline
from serving_core.runtime import Runtime
from tests.conftest import PROBE
from tests.servers import (
    ROOT,
    SERVING_CORE,
    Server,
    base_env,
    free_port,
    gunicorn_server,
    wait_for,
)

pytestmark = pytest.mark.e2e

SPECIES = ("setosa", "versicolor", "virginica")
ONE_WORKER = {"SERVING_WORKERS": "1"}


def post(server: Server, payload: dict, **kwargs) -> requests.Response:
    return requests.post(server.url + "/predict", json=payload, timeout=30, **kwargs)


def write_pipeline(folder: Path, spec: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(spec))
    return str(folder)


# -- the iris example: three classifiers and a parallel pipeline ----------------


@pytest.fixture(scope="module")
def iris() -> Iterator[dict[str, Server]]:
    with contextlib.ExitStack() as stack:
        servers = {
            species: stack.enter_context(
                gunicorn_server({"SERVING_HANDLER": f"handlers/iris-{species}", **ONE_WORKER})
            )
            for species in SPECIES
        }
        urls = {f"IRIS_{species.upper()}_URL": servers[species].url for species in SPECIES}
        servers["pipeline"] = stack.enter_context(
            gunicorn_server({"SERVING_HANDLER": "handlers/iris-pipeline", **ONE_WORKER, **urls})
        )
        yield servers


@pytest.mark.example("iris", "iris-pipeline", "iris-setosa", "iris-versicolor", "iris-virginica")
def test_the_iris_pipelines_best_label_agrees_with_one_vs_rest_on_the_whole_data_set(iris):
    from sklearn.datasets import load_iris
    from sklearn.multiclass import OneVsRestClassifier

    from handlers.iris.onevsrest import FEATURES, estimator

    features, target = load_iris(return_X_y=True)
    expected = [
        SPECIES[i] for i in OneVsRestClassifier(estimator()).fit(features, target).predict(features)
    ]
    rows = [dict(zip(FEATURES, map(float, row), strict=True)) for row in features]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda row: post(iris["pipeline"], row), rows))
    assert {a.status_code for a in answers} == {200}
    bodies = [a.json() for a in answers]
    assert [b["label"] for b in bodies] == expected
    for body in bodies:
        assert set(body["scores"]) == set(SPECIES)
        assert body["probability"] == max(body["scores"].values())
        assert [s["status"] for s in body["stages"]] == ["ran"] * 3


@pytest.mark.example("iris", "iris-pipeline", "iris-setosa", "iris-versicolor", "iris-virginica")
def test_request_ids_show_up_in_every_stages_log(iris):
    answer = post(iris["pipeline"], json_row(), headers={"X-Request-ID": "iris-trace-7"})
    assert answer.status_code == 200
    assert answer.headers["X-Request-ID"] == "iris-trace-7"
    for name in (*SPECIES, "pipeline"):
        wait_for(
            lambda name=name: "request_id=iris-trace-7" in iris[name].output(),
            f"the request id in {name}'s log",
        )


@pytest.mark.example("iris", "iris-pipeline", "iris-setosa", "iris-versicolor", "iris-virginica")
def test_with_one_classifier_stopped_the_pipeline_answers_with_the_other_two_and_an_error(iris):
    stopped = iris["virginica"]
    os.killpg(stopped.pid, signal.SIGSTOP)  # it accepts connections but never answers
    try:
        answer = post(iris["pipeline"], json_row(), headers={"X-Request-Timeout": "20"})
    finally:
        os.killpg(stopped.pid, signal.SIGCONT)
    assert answer.status_code == 200
    body = answer.json()
    assert set(body["scores"]) == {"setosa", "versicolor"}
    assert body["label"] == "setosa"
    # The stage's own timeout (1 s in pipeline.yaml), not the request's 20 s, cut it off.
    assert body["results"]["virginica"] == {
        "error": {"type": "timeout", "message": "no answer within 1.000 s"}
    }
    stages = {s["stage"]: s for s in body["stages"]}
    assert stages["virginica"]["status"] == "skipped"
    assert stages["virginica"]["reason"]["type"] == "timeout"
    assert stages["setosa"]["status"] == stages["versicolor"]["status"] == "ran"


def json_row() -> dict[str, float]:
    return {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}


# -- serial pipelines over the probe handler -----------------------------------


@pytest.fixture(scope="module")
def probe() -> Iterator[Server]:
    with gunicorn_server({"SERVING_HANDLER": PROBE, **ONE_WORKER}) as server:
        yield server


@pytest.fixture(scope="module")
def serial(probe, tmp_path_factory) -> Iterator[Server]:
    folder = write_pipeline(
        tmp_path_factory.mktemp("serial") / "serial",
        {
            "kind": "serial",
            "stages": [
                {"name": "first", "url_env": "PROBE_URL", "into": "first"},
                {"name": "flaky", "url_env": "DOWN_URL", "optional": True, "retries": 1},
                {"name": "last", "url_env": "PROBE_URL"},
            ],
        },
    )
    env = {
        "SERVING_HANDLER": folder,
        "PROBE_URL": probe.url,
        "DOWN_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        **ONE_WORKER,
    }
    with gunicorn_server(env) as server:
        yield server


def test_a_serial_pipeline_skips_an_optional_failing_stage_and_says_so(serial):
    answer = post(serial, {"text": "hello"})
    assert answer.status_code == 200
    body = answer.json()
    assert body["text"] == "hello"  # the last stage's answer
    assert [(s["stage"], s["status"]) for s in body["stages"]] == [
        ("first", "ran"),
        ("flaky", "skipped"),
        ("last", "ran"),
    ]
    flaky = body["stages"][1]
    assert flaky["reason"]["type"] == "unavailable"
    assert flaky["attempts"] == 2  # one retry: a refused connection never reached the stage
    assert all(s["elapsed_ms"] >= 0 for s in body["stages"])


def test_a_required_stage_that_fails_gives_a_json_502_naming_it(serial):
    answer = post(serial, {"text": "hello", "fail": True})  # the probe answers 500
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["type"] == "bad_gateway"
    assert error["message"].startswith("stage 'first' failed: HTTP 500 model_error")
    assert error["details"]["stage"] == "first"


# gevent: the stages are called from greenlets; gthread: from the pipeline's thread pool.
@pytest.mark.parametrize("worker_class", ["gevent", "gthread"])
def test_a_required_stage_that_is_down_gives_a_json_502_naming_it(probe, tmp_path, worker_class):
    folder = write_pipeline(
        tmp_path / "down",
        {
            "kind": "parallel",
            "aggregate": "all",
            "stages": [
                {"name": "probe", "url_env": "PROBE_URL"},
                {"name": "ranker", "url_env": "RANKER_URL", "retries": 0},
            ],
        },
    )
    ranker = f"127.0.0.1:{free_port()}"
    env = {
        "SERVING_HANDLER": folder,
        "PROBE_URL": probe.url,
        "RANKER_URL": f"http://{ranker}",
        "SERVING_WORKER_CLASS": worker_class,
        **ONE_WORKER,
    }
    with gunicorn_server(env) as server:
        answer = post(server, {"text": "hello"})
        logs = server.output()
    assert answer.status_code == 502
    assert answer.headers["Content-Type"] == "application/json"
    error = answer.json()["error"]
    assert error["type"] == "bad_gateway"
    assert error["message"].startswith("stage 'ranker' failed: connection failed")
    # The stage's address is internal: the server's log has it, the client never.
    assert "127.0.0.1" not in answer.text
    assert ranker.split(":")[1] in logs
    assert [s["status"] for s in error["details"]["stages"]] == ["ran", "failed"]


class _Rendezvous(http.server.BaseHTTPRequestHandler):
    """A stage that answers only once both stages' calls have arrived."""

    barrier: threading.Barrier

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        try:
            self.server.barrier.wait()  # type: ignore[attr-defined]
            status, body = 200, b'{"score": 1}'
        except threading.BrokenBarrierError:
            status, body = 503, b'{"error": {"type": "alone", "message": "called alone"}}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


# The runtime the server passes down: greenlets on the gevent worker's hub, the
# pipeline's threads under gthread. Called one after the other, the first stage
# would wait at the rendezvous alone until it breaks.
@pytest.mark.parametrize("worker_class", ["gevent", "gthread"])
def test_a_parallel_pipeline_calls_its_stages_at_the_same_time(tmp_path, worker_class):
    stage = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Rendezvous)
    stage.barrier = threading.Barrier(2, timeout=5)  # type: ignore[attr-defined]
    threading.Thread(target=stage.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{stage.server_address[1]}"
    folder = write_pipeline(
        tmp_path / "rendezvous",
        {
            "kind": "parallel",
            "aggregate": "all",
            "stages": [
                {"name": "left", "url_env": "LEFT_URL", "retries": 0, "timeout_s": 20},
                {"name": "right", "url_env": "RIGHT_URL", "retries": 0, "timeout_s": 20},
            ],
        },
    )
    env = {
        "SERVING_HANDLER": folder,
        "LEFT_URL": url,
        "RIGHT_URL": url,
        "SERVING_WORKER_CLASS": worker_class,
        **ONE_WORKER,
    }
    try:
        with gunicorn_server(env) as server:
            answer = post(server, {"text": "hello"})
    finally:
        stage.shutdown()
        stage.server_close()
    assert answer.status_code == 200, answer.text
    assert [s["status"] for s in answer.json()["stages"]] == ["ran", "ran"]


def test_a_stage_that_wants_an_api_key_gets_the_one_its_key_env_holds(tmp_path):
    key = "stage-key-0123456789"
    folder = write_pipeline(
        tmp_path / "keyed",
        {
            "kind": "serial",
            "stages": [{"name": "locked", "url_env": "LOCKED_URL", "key_env": "LOCKED_KEY"}],
        },
    )
    bare = write_pipeline(
        tmp_path / "bare",
        {"kind": "serial", "stages": [{"name": "locked", "url_env": "LOCKED_URL"}]},
    )
    locked_env = {"SERVING_HANDLER": PROBE, "SERVING_API_KEYS": key, **ONE_WORKER}
    with gunicorn_server(locked_env) as locked:
        # A gateway in front would check this pipeline's callers: allowed explicitly.
        env = {
            "LOCKED_URL": locked.url,
            "LOCKED_KEY": key,
            "SERVING_PIPELINE_WITHOUT_KEYS": "true",
            **ONE_WORKER,
        }
        with gunicorn_server({"SERVING_HANDLER": folder, **env}) as keyed:
            answer = post(keyed, {"text": "hello"})
        with gunicorn_server({"SERVING_HANDLER": bare, **env}) as without:
            refused = post(without, {"text": "hello"})
        logs = locked.output()
    assert answer.status_code == 200
    assert answer.json()["text"] == "hello"
    # Without key_env the stage's 401 is the pipeline's 502, naming the stage.
    assert refused.status_code == 502
    assert refused.json()["error"]["message"].startswith("stage 'locked' failed: HTTP 401")
    assert key not in logs


def test_a_pipeline_that_sends_keys_but_asks_none_refuses_to_start(tmp_path):
    folder = write_pipeline(
        tmp_path / "relay",
        {
            "kind": "serial",
            "stages": [{"name": "locked", "url_env": "LOCKED_URL", "key_env": "LOCKED_KEY"}],
        },
    )
    env = {
        "SERVING_HANDLER": folder,
        "LOCKED_URL": "http://127.0.0.1:1",
        "LOCKED_KEY": "stage-key-0123456789",
        **ONE_WORKER,
    }
    result = subprocess.run(
        [str(SERVING_CORE), "serve"],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "SERVING_PIPELINE_WITHOUT_KEYS=true" in result.stderr
    assert "LOCKED_KEY" in result.stderr
    assert "stage-key-0123456789" not in result.stderr


def ready_when_probe_is(folder: Path) -> Path:
    """A pipeline.yaml whose readiness is its one stage's, at PROBE_URL."""
    spec = {
        "kind": "serial",
        "readiness": True,
        "stages": [{"name": "probe", "url_env": "PROBE_URL"}],
    }
    return Path(write_pipeline(folder, spec)) / "pipeline.yaml"


def test_readiness_asks_the_required_stages_when_the_file_says_so(probe, tmp_path):
    path = ready_when_probe_is(tmp_path / "ready")
    up = pipeline.load(path, {"PROBE_URL": probe.url})
    down = pipeline.load(path, {"PROBE_URL": f"http://127.0.0.1:{free_port()}"})
    for one in (up, down):
        one.setup_worker()
    assert up.ready()
    assert not down.ready()


def test_readiness_waits_on_the_runtimes_lock(probe, tmp_path):
    # Held across the stages' /readyz calls, which yield to the hub under gevent: a
    # native lock there would let a second probe block the worker's hub for good.
    taken: list[str] = []

    class Recorded:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __enter__(self) -> None:
            taken.append("enter")
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()

    path = ready_when_probe_is(tmp_path / "ready")
    runtime = Runtime("gevent", new_lock=Recorded)
    one = pipeline.load(path, {"PROBE_URL": probe.url}, runtime)
    one.setup_worker()
    assert one.ready()
    assert taken == ["enter"]


# -- prep→pred: two MiniLM services in series, pred over V2 gRPC ---------------


@pytest.mark.example("minilm", "minilm-prep", "minilm-ids", "minilm-prep-pred")
@pytest.mark.model
def test_prep_then_pred_over_grpc_gives_the_single_minilm_services_embeddings():
    import numpy as np

    from serving_core.context import Context
    from serving_core.engine.engine import Engine
    from serving_core.loading import load_handler

    texts = [
        "Paris is the capital of France.",
        "A man is playing a guitar on the street.",
        "déjà vu " * 200,  # past 256 tokens: truncated the same way in both
    ]
    single = load_handler(str(ROOT / "handlers/minilm"))
    single.handler.setup()
    single.handler.setup_worker()
    engine = Engine(single.handler, max_batch_size=16)
    expected = engine.predict_many([{"text": t} for t in texts], [Context("ref")] * len(texts))
    gthread = {"SERVING_WORKER_CLASS": "gthread", **ONE_WORKER}
    grpc_port = free_port()
    with contextlib.ExitStack() as stack:
        prep = stack.enter_context(
            gunicorn_server({"SERVING_HANDLER": "handlers/minilm-prep", **ONE_WORKER})
        )
        pred_env = {
            "SERVING_HANDLER": "handlers/minilm-ids",
            "SERVING_GRPC_PORT": str(grpc_port),
            **gthread,
        }
        pred = stack.enter_context(gunicorn_server(pred_env))
        env = {
            "SERVING_HANDLER": "handlers/minilm-prep-pred",
            "MINILM_PREP_URL": prep.url,
            "MINILM_IDS_GRPC": f"127.0.0.1:{grpc_port}",
            **gthread,
        }
        pair = stack.enter_context(gunicorn_server(env))
        answers = [post(pair, {"text": t}) for t in texts]
        logs = pred.output()
        metrics = requests.get(pred.url + "/metrics", timeout=10).text
    for answer, reference in zip(answers, expected, strict=True):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert [(s["stage"], s["status"]) for s in body["stages"]] == [
            ("prep", "ran"),
            ("pred", "ran"),
        ]
        got = np.array(body["embedding"])
        np.testing.assert_allclose(got, np.asarray(reference["embedding"]), rtol=0, atol=1e-5)
    # pred answered over gRPC (its metrics count the calls), never over /predict.
    assert "POST /predict" not in logs
    infer = (
        'serving_requests_total{protocol="grpc",route="/inference.GRPCInferenceService/ModelInfer"'
        ',status="200"} 3.0'
    )
    assert infer in metrics, metrics
