"""The gRPC front beside the default (gevent) worker, and the HTTP front's tenancy on it
(issue 42): rows from both fronts ride in one batch; keys, their caller identity, a
keys file gone bad, SERVING_PRIVATE_ENDPOINTS and SERVING_PUBLIC_METADATA hold alike on
both; long-lived streams cannot starve inference; a client's request id cannot forge an
access line; a second server cannot share the port; a client's own short deadline is
named as such. Each through a real server and a real gRPC client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
import pytest
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.servers import (
    ROOT,
    Server,
    base_env,
    free_port,
    gunicorn_server,
    wait_for,
)

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.e2e]

HANDLER = str(Path(__file__).parent / "tensors_handler.py")
MODEL = "scaler"
KEY_A = "grpc-front-key-a-" + "a" * 20
KEY_B = "grpc-front-key-b-" + "b" * 20


def scaler(**more: str) -> dict[str, str]:
    """The tensors handler on one worker of the default class, gRPC on."""
    return {
        "SERVING_HANDLER": HANDLER,
        "SERVING_WORKERS": "1",
        "SERVING_GRPC_PORT": str(free_port()),
        **more,
    }


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Server]:
    env = scaler(**getattr(request, "param", {}))
    with gunicorn_server(env) as running:
        running.grpc = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"  # type: ignore[attr-defined]
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback:\n{log[-4000:]}"


def inputs(first: float, sleep_s: float = 0.0) -> list[Any]:
    values = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    values.set_data_from_numpy(np.array([[first, 2, 3]], dtype=np.float32))
    sleep = grpcclient.InferInput("SLEEP", [1], "FP64")
    sleep.set_data_from_numpy(np.array([sleep_s], dtype=np.float64))
    return [values, sleep]


def queue_depth(url: str) -> float:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("serving_queue_depth"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_http_and_grpc_rows_ride_in_one_batch_on_the_default_worker(served: Any) -> None:
    """Item 1: the gevent worker's batcher takes a gRPC row and an HTTP row together."""
    client = grpcclient.InferenceServerClient(served.grpc)

    def attempt(index: int) -> tuple[int, int, int]:
        """The batch sizes of a 5 s sleeper, then of a gRPC and an HTTP row sent while it
        runs (the handler reports each item's batch size)."""
        with ThreadPoolExecutor(3) as pool:
            sleeper = pool.submit(
                requests.post,
                served.url + "/predict",
                json={"values": [index, 0, 0], "sleep_s": 5},
                timeout=60,
            )
            time.sleep(0.5)  # ordering only: the sleeper's batch size says if it ran alone
            over_grpc = pool.submit(client.infer, MODEL, inputs(index + 7), client_timeout=60)
            over_http = pool.submit(
                requests.post, served.url + "/predict", json={"values": [index + 8, 2, 3]}
            )
            wait_for(lambda: queue_depth(served.url) == 2 or sleeper.done(), "both queued")
            http_answer = over_http.result().json()
            np.testing.assert_array_equal(
                over_grpc.result().as_numpy("OUTPUT0"), [[2 * (index + 7), 4, 6]]
            )
            assert http_answer["doubled"] == [2 * (index + 8), 4, 6]
            return (
                sleeper.result().json()["batch"],
                int(over_grpc.result().as_numpy("BATCH")[0]),
                http_answer["batch"],
            )

    for index in range(3):  # a loaded machine may start the sleeper late: try again
        sleeper_batch, grpc_batch, http_batch = attempt(index * 100)
        if sleeper_batch == 1:
            break
    assert sleeper_batch == 1, "the sleeper never ran alone"
    assert grpc_batch == http_batch == 2


@pytest.mark.parametrize("served", [{"SERVING_API_KEYS": f"{KEY_A},{KEY_B}"}], indirect=True)
def test_h1_one_keys_cached_answer_never_answers_another_key_over_grpc(served: Any) -> None:
    client = grpcclient.InferenceServerClient(served.grpc)

    def batch(key: str) -> int:
        headers = {"authorization": f"Bearer {key}"}
        return int(client.infer(MODEL, inputs(5), headers=headers).as_numpy("BATCH")[0])

    assert batch(KEY_A) == 1  # run by the model, and cached for key A
    # A cache hit answers what was stored: the same batch count. Key B's call must run
    # the model, which the metric of model calls shows.
    before = served_batches(served.url)
    batch(KEY_B)
    assert served_batches(served.url) == before + 1, "key B got key A's cached answer"
    batch(KEY_A)
    assert served_batches(served.url) == before + 1, "key A's own entry was not used"


def served_batches(url: str) -> float:
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("serving_batch_size_count"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_h2_a_keys_file_gone_bad_fails_closed_on_both_fronts(tmp_path: Path) -> None:
    """A respawned worker starts (it used to crash the server at the gRPC front's
    start), /readyz says why, and neither front lets the bad file's lines pass."""
    keys = tmp_path / "keys"
    keys.write_text(KEY_A + "\n")
    env = scaler(SERVING_API_KEYS_FILE=str(keys))
    address = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"
    with gunicorn_server(env) as running:
        client = grpcclient.InferenceServerClient(address)
        assert client.infer(MODEL, inputs(1), headers={"x-api-key": KEY_A})
        keys.write_text("short\n")  # not a key: the file is bad now
        (worker,) = workers(running)
        os.kill(worker, signal.SIGKILL)  # gunicorn forks a new one, which starts its front
        wait_for(lambda: len(workers(running) - {worker}) == 1, "a new worker", timeout_s=60)
        wait_for(lambda: requests.get(running.url + "/healthz", timeout=10).ok, "it serves")
        wait_for(
            lambda: requests.get(running.url + "/readyz", timeout=10).status_code == 503,
            "/readyz 503",
            timeout_s=30,
        )
        assert "SERVING_API_KEYS_FILE" in requests.get(running.url + "/readyz", timeout=10).text
        wait_for(lambda: grpc_refuses(address, KEY_A), "the new worker's front refuses A")
        assert running.process.poll() is None, "the server stopped"
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status in (1, 2)


def workers(server: Server) -> set[int]:
    return {child.pid for child in psutil.Process(server.pid).children()}


def grpc_refuses(address: str, key: str) -> bool:
    client = grpcclient.InferenceServerClient(address)
    try:
        client.infer(MODEL, inputs(1), headers={"x-api-key": key}, client_timeout=10)
    except InferenceServerException as exc:
        return exc.status() == "StatusCode.UNAUTHENTICATED"
    return False


@pytest.mark.parametrize("served", [{"SERVING_THREADS": "8"}], indirect=True)
def test_m1_open_reflection_streams_do_not_starve_inference(served: Any) -> None:
    channel = grpc.insecure_channel(served.grpc)
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    held: list[Any] = []
    stop = threading.Event()

    def requests_until_stopped() -> Iterator[Any]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        stop.wait()

    for _ in range(8):  # as many as SERVING_THREADS: they took every thread before
        held.append(stub.ServerReflectionInfo(requests_until_stopped(), timeout=60))
    outcomes = [first_of(stream) for stream in held]
    assert grpc.StatusCode.OK in outcomes, outcomes
    refusals = [o for o in outcomes if o != grpc.StatusCode.OK]
    assert refusals, outcomes
    assert all("long-lived" in o for o in refusals), refusals
    try:
        client = grpcclient.InferenceServerClient(served.grpc)
        result = client.infer(MODEL, inputs(3), client_timeout=30)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[6, 4, 6]])
    finally:
        stop.set()
        channel.close()


def first_of(stream: Any) -> Any:
    """OK when the stream's first answer came; else the refusal's details."""
    try:
        next(stream)
    except grpc.RpcError as exc:
        return f"{exc.code()}: {exc.details()}"
    return grpc.StatusCode.OK


def grpc_code(call: Any) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def describe_calls(address: str, metadata: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    channel = grpc.insecure_channel(address)
    inference = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)

    def reflect() -> None:
        asked = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        next(reflection.ServerReflectionInfo(asked, metadata=metadata, timeout=10))

    return {
        "server": lambda: inference.ServerMetadata(
            service_pb2.ServerMetadataRequest(), metadata=metadata, timeout=10
        ),
        "model": lambda: inference.ModelMetadata(
            service_pb2.ModelMetadataRequest(name=MODEL), metadata=metadata, timeout=10
        ),
        "reflection": reflect,
    }


@pytest.mark.parametrize("served", [{"SERVING_PRIVATE_ENDPOINTS": "true"}], indirect=True)
def test_i5_private_endpoints_without_keys_hide_every_description(served: Any) -> None:
    for name, call in describe_calls(served.grpc).items():
        assert grpc_code(call) == grpc.StatusCode.UNIMPLEMENTED, name
    for path in ("/v2", "/v2/", f"/v2/models/{MODEL}", "/metadata"):
        assert requests.get(served.url + path, timeout=10).status_code == 404, path
    # What serves traffic stays: readiness and inference.
    assert requests.get(served.url + f"/v2/models/{MODEL}/ready", timeout=10).status_code == 200
    client = grpcclient.InferenceServerClient(served.grpc)
    assert client.is_model_ready(MODEL)


@pytest.mark.parametrize(
    "served",
    [
        {"SERVING_API_KEYS": KEY_A},
        {"SERVING_API_KEYS": KEY_A, "SERVING_PRIVATE_ENDPOINTS": "true"},
        {"SERVING_API_KEYS": KEY_A, "SERVING_PUBLIC_METADATA": "true"},
    ],
    indirect=True,
)
def test_i5_descriptions_need_a_key_unless_public_metadata(
    served: Any, request: pytest.FixtureRequest
) -> None:
    env = request.node.callspec.params["served"]
    public = env.get("SERVING_PUBLIC_METADATA") == "true"
    without = grpc.StatusCode.OK if public else grpc.StatusCode.UNAUTHENTICATED
    for name, call in describe_calls(served.grpc).items():
        assert grpc_code(call) == without, name
    for name, call in describe_calls(served.grpc, (("x-api-key", KEY_A),)).items():
        assert grpc_code(call) == grpc.StatusCode.OK, name
    for path in ("/v2", f"/v2/models/{MODEL}"):
        status = requests.get(served.url + path, timeout=10).status_code
        assert status == (200 if public else 401), path
        keyed = requests.get(served.url + path, headers={"X-API-Key": KEY_A}, timeout=10)
        assert keyed.status_code == 200, path


def test_l5_a_clients_request_id_cannot_forge_an_access_line(served: Any) -> None:
    forged = 'x" 200 - 1ms request_id=forged\n127.0.0.1 "POST /admin HTTP/2" 200'
    message = service_pb2.ModelInferRequest(model_name=MODEL, id=forged)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
    message.raw_input_contents.append(np.array([1, 2, 3], dtype="<f4").tobytes())
    with grpc.insecure_channel(served.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelInfer(message, timeout=30)
    assert reply.id == forged  # the protocol's echo, to the client alone
    wait_for(lambda: "ModelInfer" in served.output(), "the call's access line")
    log = served.output()
    assert "/admin" not in log
    assert "request_id=forged" not in log


def serve_once(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``serving-core serve`` with ``env``, expected to stop at start-up."""
    return subprocess.run(
        [sys.executable, "-m", "serving_core.commands.cli", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )


def test_l4_a_second_server_on_the_same_grpc_port_refuses_to_start(served: Any) -> None:
    port = served.grpc.rpartition(":")[2]
    env = base_env(
        {
            "SERVING_HANDLER": HANDLER,
            "SERVING_WORKERS": "1",
            "SERVING_BIND": f"127.0.0.1:{free_port()}",
            "SERVING_GRPC_PORT": port,
        }
    )
    second = serve_once(env)
    assert second.returncode != 0
    assert f"SERVING_GRPC_PORT={port}" in second.stderr
    assert "in use" in second.stderr
    assert "Traceback" not in second.stderr
    # Every call still reaches the first server.
    client = grpcclient.InferenceServerClient(served.grpc)
    for index in range(10):
        assert client.infer(MODEL, inputs(index), client_timeout=30)


def test_f6_a_clients_own_short_deadline_is_named_on_both_fronts(served: Any) -> None:
    client = grpcclient.InferenceServerClient(served.grpc)
    for index in range(3):  # the cost model learns a batch's time
        client.infer(MODEL, inputs(100 + index, sleep_s=0.05), client_timeout=30)
    answer = requests.post(
        served.url + "/predict",
        json={"values": [1, 2, 3]},
        headers={"X-Request-Timeout": "0.0001"},
        timeout=10,
    )
    assert answer.status_code == 504
    message = answer.json()["error"]["message"]
    # The client's own deadline, named as such (it was blamed on a proxy or the queue).
    assert "this request's own deadline (0.0001 s" in message, message
    with pytest.raises(InferenceServerException) as late:
        client.infer(MODEL, inputs(200), client_timeout=0.001)
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    # The model learns that a batch takes half a second; a request that gives itself
    # 0.1 s is told no retry can meet its deadline: a 504, not a 503 whose Retry-After
    # promises one.
    for index in range(5):  # the most of what it has seen: the median is 0.5 s
        client.infer(MODEL, inputs(300 + index, sleep_s=0.5), client_timeout=30)
    short = requests.post(
        served.url + "/predict",
        json={"values": [4, 5, 6]},
        headers={"X-Request-Timeout": "0.1"},
        timeout=10,
    )
    assert short.status_code == 504, short.text
    # Admission's "shorter than one batch"; on a loaded machine it may pass even
    # before admission, which names it as well.
    assert "this request's own deadline (0.1 s" in short.json()["error"]["message"]
    assert "Retry-After" not in short.headers


def test_grpc_port_in_use_by_anything_is_refused_with_its_name(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = base_env(
            {
                "SERVING_HANDLER": HANDLER,
                "SERVING_BIND": f"127.0.0.1:{free_port()}",
                "SERVING_GRPC_PORT": str(port),
                "SERVING_JOBS_PATH": str(tmp_path / "jobs.db"),
            }
        )
        second = serve_once(env)
    assert second.returncode != 0
    assert f"127.0.0.1:{port} is in use" in second.stderr


@pytest.mark.example("hashembed")
def test_h1_a_grpc_follow_up_job_is_its_keys_own() -> None:
    """The time-lag pattern over gRPC: the follow-up job is owned by the call's key, so
    that key reads it and another key gets a 404 (it was owned by no one: a 404 to its
    own key, and outside SERVING_JOBS_MAX_PER_CALLER)."""
    env = {
        "SERVING_HANDLER": str(ROOT / "handlers" / "hashembed" / "handler.py"),
        "SERVING_WORKERS": "1",
        "SERVING_GRPC_PORT": str(free_port()),
        "SERVING_FOLLOWUP_QUEUE": "slow-model",
        "SERVING_API_KEYS": f"{KEY_A},{KEY_B}",
    }
    with gunicorn_server(env) as running:
        message = service_pb2.ModelInferRequest(model_name="hash-embedding")
        tensor = message.inputs.add(name="text", datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(b"whose job is this")
        with grpc.insecure_channel(f"127.0.0.1:{env['SERVING_GRPC_PORT']}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            reply = stub.ModelInfer(message, metadata=(("x-api-key", KEY_A),), timeout=30)
        (job,) = [o for o in reply.outputs if o.name == "job_id"]
        job_id = job.contents.bytes_contents[0].decode()

        def status(key: str) -> int:
            url = f"{running.url}/jobs/{job_id}"
            return requests.get(url, headers={"X-API-Key": key}, timeout=10).status_code

        assert status(KEY_A) == 200
        assert status(KEY_B) == 404
