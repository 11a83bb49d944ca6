"""V2 requests to a real server, over REST and gRPC: what a bad one gets (a 400 or
INVALID_ARGUMENT naming what is wrong, never a 500), the limits every front keeps,
and the forms of the protocol that clients send (a scalar, ``/v2/``, typed contents).
Issue 42's findings F1, F3/L1, F4, L2, L8 and item 6."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests

from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb
from serving_core.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.servers import Server, free_port, gunicorn_server

pytestmark = pytest.mark.e2e

MAX_CHARS = 32  # SERVING_MAX_STRING_CHARS: longer than every key of a V2 request
LONG = "x" * (MAX_CHARS + 1)
INFER = "/v2/models/scaler/infer"
ROW = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    env = {
        "SERVING_HANDLER": "tests/v2/tensors_handler.py",
        "SERVING_WORKERS": "1",
        "SERVING_WORKER_CLASS": "gthread",
        "SERVING_MAX_STRING_CHARS": str(MAX_CHARS),
        "SERVING_GRPC_PORT": str(free_port()),
    }
    with gunicorn_server(env) as running:
        running.grpc = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"  # type: ignore[attr-defined]
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def stub(server: Any) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def infer(server: Server, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(server.url + INFER, json=body, timeout=30, **kwargs)


def refused(stub: Any, message: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(message, timeout=30)
    return error.value.code(), error.value.details()


@pytest.mark.parametrize("datatype", [{}, [], ["BYTES"], 3])
def test_f1_a_datatype_that_is_not_a_string_is_a_400_naming_the_input(
    server: Server, datatype: Any
) -> None:
    """F1: an unhashable datatype was looked up in the table of datatypes: a 500."""
    response = infer(server, {"inputs": [{**ROW, "datatype": datatype}]})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("input 'INPUT0': datatype ")


def test_l2_a_zero_size_tensor_with_huge_sizes_is_a_400_over_rest_and_grpc(
    server: Server, stub: Any
) -> None:
    """L2: numpy could not make the empty array of that shape: a 500 over REST, and
    UNKNOWN with the exception's text over gRPC."""
    shape = [1, 0, 2**62]
    response = infer(server, {"inputs": [{**ROW, "shape": shape, "data": []}]})
    assert response.status_code == 400, response.text
    assert "is larger than any tensor this server takes" in response.json()["error"]
    message = pb.ModelInferRequest(model_name="scaler")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    code, details = refused(stub, message)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "is larger than any tensor this server takes" in details


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_f4_infer_refuses_a_body_that_says_it_is_not_json(
    server: Server, content_type: str
) -> None:
    """F4: V2's infer read any body as JSON, a text/plain one included (/predict: 415)."""
    response = infer_raw(server, json.dumps({"inputs": [ROW]}), content_type)
    assert response.status_code == 415, response.text
    assert response.json()["error"].startswith(f"unsupported Content-Type '{content_type}'")


def infer_raw(server: Server, body: bytes | str, content_type: str | None) -> requests.Response:
    headers = {"Content-Type": content_type} if content_type is not None else {}
    return requests.post(server.url + INFER, data=body, headers=headers, timeout=30)


def test_infer_takes_json_octet_stream_and_no_content_type(server: Server) -> None:
    body = json.dumps({"inputs": [ROW]}).encode()
    for content_type in ("application/json", "application/octet-stream", None):
        response = infer_raw(server, body, content_type)
        assert response.status_code == 200, (content_type, response.text)


def test_l1_x_cache_is_not_sent_when_serving_cache_header_is_off(server: Server) -> None:
    """L1/F3: V2 REST sent X-Cache whatever SERVING_CACHE_HEADER said (off by default)."""
    first, again = (infer(server, {"inputs": [ROW]}) for _ in range(2))
    assert (first.status_code, again.status_code) == (200, 200)
    assert "X-Cache" not in first.headers
    assert "X-Cache" not in again.headers


def binary_request(text: bytes) -> tuple[bytes, dict[str, str]]:
    label = {
        "name": "LABEL",
        "datatype": "BYTES",
        "shape": [1],
        "parameters": {"binary_data_size": 4 + len(text)},
    }
    header = json.dumps({"inputs": [ROW, label]}).encode()
    body = header + struct.pack("<I", len(text)) + text
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return body, headers


def grpc_request(text: bytes, *, raw: bool) -> Any:
    message = pb.ModelInferRequest(model_name="scaler")
    values = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
    label = message.inputs.add(name="LABEL", datatype="BYTES", shape=[1])
    if raw:
        message.raw_input_contents.append(struct.pack("<3f", 1, 2, 3))
        message.raw_input_contents.append(struct.pack("<I", len(text)) + text)
    else:
        values.contents.fp32_contents.extend([1, 2, 3])
        label.contents.bytes_contents.append(text)
    return message


def test_l8_bytes_elements_keep_serving_max_string_chars_on_every_front(
    server: Server, stub: Any
) -> None:
    """L8: the limit held only for JSON strings: binary BYTES (REST's extension, gRPC's
    raw or typed contents) of any length reached the handler."""
    says = f"input 'LABEL': BYTES element 0 is longer than SERVING_MAX_STRING_CHARS={MAX_CHARS}"
    body, headers = binary_request(LONG.encode())
    response = requests.post(server.url + INFER, data=body, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(says)
    for raw in (True, False):
        code, details = refused(stub, grpc_request(LONG.encode(), raw=raw))
        assert (code, details.startswith(says)) == (grpc.StatusCode.INVALID_ARGUMENT, True)
    # Counted in characters, as a JSON string is: 32 two-byte characters pass.
    body, headers = binary_request(("\u00e9" * MAX_CHARS).encode())
    response = requests.post(server.url + INFER, data=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][1]["data"] == ["\u00e9" * MAX_CHARS]
    stub.ModelInfer(grpc_request(b"short", raw=True), timeout=30)


def test_an_invalid_row_is_named_in_the_error(server: Server) -> None:
    """Issue 42's walk: a request of several rows failed with one row's error, unnamed."""
    sleeps = {"name": "SLEEP", "datatype": "FP64", "shape": [3], "data": [0, 0, 9]}
    values = {**ROW, "shape": [3, 3], "data": [1] * 9}
    response = infer(server, {"inputs": [values, sleeps]})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("row 2 of 3 (its index in the batch dimension): ")
    assert "sleep_s" in response.json()["error"]


def test_a_scalar_tensor_of_shape_empty_is_one_row(server: Server, stub: Any) -> None:
    sleep = {"name": "SLEEP", "datatype": "FP64", "shape": [], "data": [0]}
    response = infer(server, {"inputs": [ROW, sleep]})
    assert response.status_code == 200, response.text
    bare = {**sleep, "data": 0}  # a scalar's data may be the element alone
    assert infer(server, {"inputs": [ROW, bare]}).status_code == 200
    message = grpc_request(b"a", raw=False)
    message.inputs.add(name="SLEEP", datatype="FP64", shape=[]).contents.fp64_contents.append(0)
    stub.ModelInfer(message, timeout=30)


def test_server_metadata_answers_with_the_trailing_slash_too(server: Server) -> None:
    bare, slash = (requests.get(server.url + path, timeout=30) for path in ("/v2", "/v2/"))
    assert (bare.status_code, slash.status_code) == (200, 200)
    assert slash.json() == bare.json()
