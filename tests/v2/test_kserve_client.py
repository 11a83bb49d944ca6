"""KServe's own Python clients (``kserve.InferenceRESTClient`` with the V2 protocol, and
``kserve.InferenceGRPCClient``) against the MiniLM service, directly and through the
real nginx: the same embedding as /predict, as Triton's clients get in test_tritonclient
and test_grpc. The two clients are KServe's, not ours: what an InferenceGraph node or a
KServe user's code sends. They run in a process of their own (kserve_calls.py says why)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.nginx_server import nginx_server
from tests.servers import Server, free_port

if importlib.util.find_spec("kserve") is None:
    pytest.skip("kserve is not installed (requirements-dev.txt)", allow_module_level=True)
from tests.v2 import test_grpc as direct

CALLS = Path(__file__).with_name("kserve_calls.py")

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("minilm")]

# The MiniLM with a gRPC port that tests/v2 shares (tests/v2/conftest.py).
server, MODEL, TEXTS = direct.server, direct.MODEL, direct.TEXTS


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


def kserve_call(kind: str, where: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(CALLS), kind, where, MODEL, *TEXTS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # its stderr goes into the assertion
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("front", ["rest", "grpc"])
def test_kserves_clients_get_the_same_embeddings_as_predict(
    endpoints: dict[str, str], predicted: np.ndarray, front: str
) -> None:
    result = kserve_call(front, endpoints[front])
    assert result["ready"] is True
    assert result["id"] == f"k-{front}"
    assert result["shape"] == [len(TEXTS), 384]
    # KServe's gRPC client sends typed contents: the answer's values come typed too.
    assert result["data"] == len(TEXTS) * 384
    np.testing.assert_allclose(
        np.asarray(result["embedding"], dtype=np.float32), predicted, rtol=0, atol=1e-6
    )


def test_a_bad_tensor_is_refused_to_kserves_grpc_client_naming_the_input(
    endpoints: dict[str, str],
) -> None:
    result = kserve_call("bad", endpoints["grpc"])
    assert result["code"] == "INVALID_ARGUMENT"
    assert "input 'text'" in (result["details"] or "")
