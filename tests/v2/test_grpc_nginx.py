"""tritonclient.grpc through the real nginx (the image's entrypoint and templates,
tests/nginx_server.py) to a real gunicorn's gRPC front: the same answer as direct,
and with the app's gRPC port down, UNAVAILABLE with nginx's message (a gRPC status
from its error_page, not a protocol error)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.nginx_server import nginx_server
from tests.servers import free_port
from tests.v2 import test_grpc as direct  # skips this module where tritonclient is missing

# test_grpc's fixtures: the MiniLM with a gRPC port tests/v2 shares, a client calling it.
server, client = direct.server, direct.client
MODEL, TEXTS, grpcclient = direct.MODEL, direct.TEXTS, direct.grpcclient
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("minilm")]


NGINX_BODY_LIMIT = 65536


def nginx_grpc(grpc_upstream: str) -> Any:
    port = free_port()
    settings = {"NGINX_GRPC_PORT": str(port), "NGINX_GRPC_UPSTREAM": grpc_upstream}
    return port, settings


@pytest.fixture(scope="module")
def via_nginx(server: Any) -> Iterator[Any]:
    port, settings = nginx_grpc(server.grpc)
    # nginx's body limit below the app's own (1 MiB), so that nginx refuses first.
    settings["SERVING_MAX_BODY_BYTES"] = str(NGINX_BODY_LIMIT)
    with nginx_server(server.url.removeprefix("http://"), settings):
        yield grpcclient.InferenceServerClient(f"127.0.0.1:{port}")


def embed(target: Any) -> np.ndarray:
    text = grpcclient.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
    return np.asarray(target.infer(MODEL, [text], client_timeout=60).as_numpy("embedding"))


def test_tritonclient_grpc_through_nginx_gets_the_direct_answer(
    client: Any, via_nginx: Any
) -> None:
    assert via_nginx.is_model_ready(MODEL)
    np.testing.assert_allclose(embed(via_nginx), embed(client), rtol=0, atol=1e-6)
    # The app's own statuses pass through nginx untouched.
    wrong = grpcclient.InferInput("text", [1], "FP32")
    wrong.set_data_from_numpy(np.array([1.5], dtype=np.float32))
    with pytest.raises(InferenceServerException) as refused:
        via_nginx.infer(MODEL, [wrong])
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "input 'text'" in refused.value.message()


def test_a_message_over_the_body_limit_is_nginxs_resource_exhausted(via_nginx: Any) -> None:
    text = grpcclient.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"x" * (2 * NGINX_BODY_LIMIT)], dtype=object))
    with pytest.raises(InferenceServerException) as refused:
        via_nginx.infer(MODEL, [text], client_timeout=60)
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert f"larger than {NGINX_BODY_LIMIT} bytes" in refused.value.message()


def test_with_the_apps_grpc_port_down_nginx_answers_unavailable() -> None:
    # Nothing listens on either upstream: nginx alone answers.
    port, settings = nginx_grpc(f"127.0.0.1:{free_port()}")
    with nginx_server(f"127.0.0.1:{free_port()}", settings):
        down = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        with pytest.raises(InferenceServerException) as refused:
            down.is_server_live()
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    assert "gRPC port is unreachable" in refused.value.message()
