"""The gRPC front shares the worker's batcher and admission: concurrent calls batch
(the handler reports its batch size), a full queue is RESOURCE_EXHAUSTED with a
retry-after, and a deadline ends a call with DEADLINE_EXCEEDED, never a hang; fuzzed
requests are answered or INVALID_ARGUMENT, and leave no traceback in the log; API keys
and draining are the HTTP front's."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.servers import Server, free_port, gunicorn_server, wait_for

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.e2e]

MODEL = "scaler"
CALLS = 64


def scaler_env(**more: str) -> dict[str, str]:
    return {
        "SERVING_HANDLER": "tests/v2/tensors_handler.py",
        # Two workers bind the one gRPC port (SO_REUSEPORT); a client's channel is one
        # connection, so its calls meet in one worker's batcher.
        "SERVING_WORKERS": "2",
        "SERVING_THREADS": "128",
        "SERVING_MAX_BATCH_SIZE": "8",
        "SERVING_MAX_QUEUE": str(CALLS),
        "SERVING_BATCH_POLICY": "fixed",
        "SERVING_MAX_WAIT_MS": "50",
        "SERVING_GRPC_PORT": str(free_port()),
        **more,
    }


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    env = scaler_env()
    with gunicorn_server(env) as running:
        running.grpc = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"  # type: ignore[attr-defined]
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback:\n{log[-4000:]}"


def inputs(first: int, sleep_s: float = 0.0) -> list[Any]:
    # Each call its own values: identical calls would share one answer (the cache).
    values = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    values.set_data_from_numpy(np.array([[first, 2, 3]], dtype=np.float32))
    sleep = grpcclient.InferInput("SLEEP", [1], "FP64")
    sleep.set_data_from_numpy(np.array([sleep_s], dtype=np.float64))
    return [values, sleep]


def test_concurrent_grpc_calls_run_in_batches(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)

    def call(index: int) -> int:
        result = client.infer(MODEL, inputs(index), client_timeout=60)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[2 * index, 4, 6]])
        return int(result.as_numpy("BATCH")[0])

    with ThreadPoolExecutor(CALLS) as pool:
        batches = list(pool.map(call, range(CALLS)))
    # The handler's own count of the items in the batch each call ran in.
    assert max(batches) > 1, batches


def test_overload_is_resource_exhausted_with_a_retry_hint(server: Any) -> None:
    # 8 run, 64 queue: the rest find the queue full and are refused at once.
    def request(index: int) -> Any:
        message = service_pb2.ModelInferRequest(model_name=MODEL)
        message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
        message.inputs.add(name="SLEEP", datatype="FP64", shape=[1])
        message.raw_input_contents.extend(
            [np.array([index, 2, 3], dtype="<f4").tobytes(), np.array([0.3], "<f8").tobytes()]
        )
        return message

    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        def call(index: int) -> tuple[grpc.StatusCode, dict[str, str]]:
            try:
                stub.ModelInfer(request(index), timeout=60)
            except grpc.RpcError as exc:
                return exc.code(), dict(exc.trailing_metadata() or ())
            return grpc.StatusCode.OK, {}

        with ThreadPoolExecutor(CALLS + 32) as pool:
            outcomes = list(pool.map(call, range(CALLS + 32)))
    codes = {code for code, _ in outcomes}
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    refused = [metadata for code, metadata in outcomes if code != grpc.StatusCode.OK]
    assert refused, "no call was refused"
    assert all(int(metadata["retry-after"]) >= 1 for metadata in refused), refused


def test_a_tiny_deadline_is_deadline_exceeded(server: Any) -> None:
    client = grpcclient.InferenceServerClient(server.grpc)
    with pytest.raises(InferenceServerException) as late:
        client.infer(MODEL, inputs(-1, sleep_s=2.0), client_timeout=0.2)
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"


def test_a_draining_worker_says_not_serving_and_still_answers() -> None:
    env = scaler_env(SERVING_DRAIN_S="3")
    address = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"
    with gunicorn_server(env) as running, grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        asked = health_pb2.HealthCheckRequest(service="")

        def status() -> int:
            return int(health.Check(asked, timeout=10).status)

        assert status() == health_pb2.HealthCheckResponse.SERVING
        os.kill(running.pid, signal.SIGTERM)  # the master, as Kubernetes sends it
        wait_for(lambda: status() == health_pb2.HealthCheckResponse.NOT_SERVING, "NOT_SERVING")
        client = grpcclient.InferenceServerClient(address)
        assert client.infer(MODEL, inputs(7), client_timeout=30).as_numpy("BATCH")[0] >= 1
        assert not client.is_server_ready()


def test_with_api_keys_a_call_needs_one_and_the_health_check_does_not() -> None:
    key = "grpc-test-key-" + "k" * 20
    env = scaler_env(SERVING_API_KEYS=key)
    address = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"
    with gunicorn_server(env), grpc.insecure_channel(address) as channel:
        client = grpcclient.InferenceServerClient(address)
        with pytest.raises(InferenceServerException) as refused:
            client.infer(MODEL, inputs(3), headers={"authorization": "Bearer not-the-key"})
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        assert "needs a key" in refused.value.message()
        assert key not in refused.value.message()
        for headers in ({"authorization": f"Bearer {key}"}, {"x-api-key": key}):
            result = client.infer(MODEL, inputs(3), headers=headers, client_timeout=30)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[6, 4, 6]])
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


# -- fuzzing -----------------------------------------------------------------------

DATATYPES = ["BOOL", "INT8", "INT32", "INT64", "UINT8", "UINT64", "FP16", "FP32", "FP64", "BYTES"]
CONTENTS = ["bool_contents", "int_contents", "int64_contents", "uint_contents", "fp32_contents"]
TENSORS = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["INPUT0", "LABEL"]) | st.text(max_size=6),
        "datatype": st.sampled_from(DATATYPES) | st.text(max_size=5),
        "shape": st.lists(st.integers(-2, 4), max_size=4),
        "raw": st.binary(max_size=40),
        "field": st.sampled_from(CONTENTS),
        "values": st.lists(st.integers(-300, 300), max_size=12),
    }
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(tensors=st.lists(TENSORS, min_size=1, max_size=3), raw=st.booleans())
def test_fuzzed_requests_are_answered_or_refused_naming_what_is_wrong(
    server: Any, tensors: list[dict[str, Any]], raw: bool
) -> None:
    message = service_pb2.ModelInferRequest(model_name=MODEL)
    for tensor in tensors:
        added = message.inputs.add(
            name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
        )
        if raw:
            message.raw_input_contents.append(tensor["raw"])
        else:
            values = tensor["values"]
            if tensor["field"] == "bool_contents":
                values = [value > 0 for value in values]
            elif tensor["field"] in ("uint_contents",):
                values = [abs(value) for value in values]
            getattr(added.contents, tensor["field"]).extend(values)
    with grpc.insecure_channel(server.grpc) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(message, timeout=30)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
        else:
            return
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "input " in details or "request" in details, details


def test_the_json_access_line_of_a_call_has_the_http_lines_fields() -> None:
    env = scaler_env(SERVING_LOG_FORMAT="json", SERVING_WORKERS="1")
    with gunicorn_server(env) as running:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{env['SERVING_GRPC_PORT']}")
        client.infer(MODEL, inputs(7), request_id="json-1", client_timeout=30)

        def logged() -> dict[str, Any] | None:
            for line in running.output().splitlines():
                if line.startswith("{") and '"json-1"' in line:
                    entry: dict[str, Any] = json.loads(line)
                    return entry
            return None

        entry = wait_for(logged, "the JSON access line of json-1")
    assert entry["logger"] == "gunicorn.access"
    assert entry["route"] == entry["path"] == "/inference.GRPCInferenceService/ModelInfer"
    assert (entry["status"], entry["grpc_status"], entry["protocol"]) == (200, "OK", "grpc")
    assert entry["batch_size"] == 1
    assert entry["remote_addr"] == "127.0.0.1"
    assert entry["duration_ms"] >= 0
