"""The MiniLM service with a gRPC port that test_grpc, test_grpc_nginx and
test_kserve_client all ask of the same server: started once for tests/v2, as
loading the model takes most of a module's time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import Server, free_port, gunicorn_server


@pytest.fixture(scope="package")
def minilm_grpc() -> Iterator[Server]:
    """MiniLM on one worker of the default class, its gRPC front on ``.grpc``; its log holds no
    traceback once every test of tests/v2 that used it is done."""
    env = {
        "SERVING_HANDLER": "handlers/minilm/handler.py",
        "SERVING_WORKERS": "1",
        "SERVING_GRPC_PORT": str(free_port()),
    }
    with gunicorn_server(env) as running:
        running.grpc = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"  # type: ignore[attr-defined]
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback:\n{log[-4000:]}"
