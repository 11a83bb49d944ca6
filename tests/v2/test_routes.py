"""The V2 REST routes in the app: a handler's declared tensors, rows that batch
together, binary outputs, and errors in V2's shape with /predict's statuses."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import make_app

HANDLER = str(Path(__file__).parent / "tensors_handler.py")
INFER = "/v2/models/scaler/versions/3/infer"


@pytest.fixture(scope="module")
def app() -> Iterator[Flask]:
    # A fixed window that two rows fill: they run together however the machine schedules.
    app = make_app(HANDLER, batch_policy="fixed", max_wait_ms=5000, max_batch_size=2)
    service = app.extensions["serving_core"]
    service.start()
    yield app
    service.stop()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def test_the_model_metadata_shows_the_declared_tensors_with_a_batch_dimension(client):
    body = client.get("/v2/models/scaler").get_json()
    assert body["inputs"][0] == {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 3]}
    assert body["outputs"][0] == {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 3]}
    assert body["versions"] == ["3"]


def test_rows_batch_together_and_outputs_come_back_binary_when_asked(client):
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
                {"name": "LABEL", "datatype": "BYTES", "shape": [2, 1], "data": ["a", "b"]},
            ],
            "outputs": [
                {"name": "LABEL", "parameters": {"binary_data": True}},
                {"name": "OUTPUT0"},
                {"name": "BATCH"},
            ],
        }
    ).encode()
    response = client.post(INFER, data=header, content_type="application/json")
    assert response.status_code == 200, response.get_data()
    length = int(response.headers["Inference-Header-Content-Length"])
    body = json.loads(response.data[:length])
    label, doubled, batch = body["outputs"]
    assert doubled == {
        "name": "OUTPUT0",
        "datatype": "FP32",
        "shape": [2, 3],
        "data": [2, 4, 6, 8, 10, 12],
    }
    # Both rows ran in one batch of the handler's.
    assert batch["datatype"] == "INT32"
    assert batch["data"] == [2, 2]
    assert label["parameters"] == {"binary_data_size": len(response.data) - length}
    assert response.data[length:] == struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b"


def test_binary_inputs_are_read_after_the_json(client):
    values = np.arange(6, dtype="<f4")
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [2, 3],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ]
        }
    ).encode()
    response = client.post(
        INFER,
        data=header + values.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
        content_type="application/octet-stream",
    )
    assert response.status_code == 200, response.get_data()
    assert response.get_json()["outputs"][0]["data"] == [0, 2, 4, 6, 8, 10]


@pytest.mark.parametrize(
    ("inputs", "outputs", "says"),
    [
        ([{"name": "INPUT0", "datatype": "FP64", "shape": [1, 3], "data": [1, 2, 3]}], None,
         "input 'INPUT0': datatype FP64, and it takes FP32"),
        ([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}], None,
         "input 'INPUT0': shape [1, 4], and it takes [batch, 3]"),
        ([{"name": "INPUT9", "datatype": "FP32", "shape": [1], "data": [1]}], None,
         "input 'INPUT9' is not an input of this model"),
        ([{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}],
         [{"name": "OUT"}], "output 'OUT' is not an output of this model"),
    ],
)  # fmt: skip
def test_a_bad_tensor_is_a_v2_400_naming_it(client, inputs, outputs, says):
    body = {"inputs": inputs} | ({"outputs": outputs} if outputs else {})
    response = client.post(INFER, json=body)
    assert response.status_code == 400
    assert response.get_json()["error"].startswith(says)


def test_errors_take_v2s_shape_and_predicts_statuses(client):
    assert client.get("/v2/models/other").status_code == 404
    assert "this server serves 'scaler'" in client.get("/v2/models/other/ready").get_json()["error"]
    assert client.get(INFER).get_json() == {"error": f"GET is not allowed on {INFER}"}
    slow = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
        {"name": "SLEEP", "datatype": "FP64", "shape": [2], "data": [1.0, 1.0]},
    ]}  # fmt: skip
    late = client.post(INFER, json=slow, headers={"X-Request-Timeout": "0.2"})
    assert late.status_code == 504
    assert "deadline" in late.get_json()["error"]
    # /predict's own errors keep their shape.
    assert client.post("/predict", json={}).get_json()["error"]["type"] == "invalid_input"


def test_before_the_model_loads_v2_says_not_ready_as_readyz_does():
    client = make_app(HANDLER).test_client()
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").get_json() == {"ready": False}
    assert client.get("/v2/models/scaler/ready").status_code == 503
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    response = client.post(INFER, json=body)
    assert response.status_code == 503
    assert isinstance(response.get_json()["error"], str)


def test_the_openapi_document_covers_the_v2_routes(client):
    from openapi_spec_validator import validate

    document = client.get("/openapi.json").get_json()
    validate(document)
    assert {"/v2", "/v2/health/ready", "/v2/models/{name}/versions/{version}/infer"} <= set(
        document["paths"]
    )


@pytest.mark.parametrize("header", [False, True])
def test_x_cache_is_sent_for_one_row_only_with_the_cache_header_setting(header):
    app = make_app(HANDLER, max_wait_ms=1, cache_header=header)
    service = app.extensions["serving_core"]
    service.start()
    try:
        client = app.test_client()
        row = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}
        one = {"inputs": [row]}
        two = {"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]},
        ]}  # fmt: skip
        first, again, rows = (client.post(INFER, json=body) for body in (one, one, two))
    finally:
        service.stop()
    assert [r.status_code for r in (first, again, rows)] == [200, 200, 200]
    told = [r.headers.get("X-Cache") for r in (first, again, rows)]
    assert told == (["miss", "hit", None] if header else [None, None, None])


def test_a_body_over_the_limit_is_a_v2_413_before_a_refusal_at_admission():
    # Never started: admission would refuse anything (503), but the length comes first.
    client = make_app(HANDLER, max_body_bytes=64).test_client()
    too_large = client.post(INFER, data=b"{" + b" " * 64 + b"}", content_type="application/json")
    assert too_large.status_code == 413
    assert too_large.get_json() == {
        "error": "the request body is larger than SERVING_MAX_BODY_BYTES=64 bytes allows; "
        "send less, or raise the setting"
    }
    assert client.post(INFER, data=b"{}", content_type="application/json").status_code == 503
