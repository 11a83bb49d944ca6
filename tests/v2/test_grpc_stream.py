"""Triton's ``ModelStreamInfer`` with tritonclient's own stream API, unchanged, against
a real server of a generating handler (tests/handlers/generating) on its gRPC port:
a response a chunk, the empty final response it asks for, errors in the stream,
and a one-shot handler's one answer; directly and through nginx's h2c listener."""

from __future__ import annotations

import json
import queue
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.conftest import HANDLERS
from tests.nginx_server import nginx_server
from tests.servers import Server, free_port, gunicorn_server, wait_for

grpcclient = pytest.importorskip("tritonclient.grpc")

pytestmark = pytest.mark.e2e
MODEL = "generating"
WAIT_S = 60.0


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grpc-stream") / "steps.jsonl"


@pytest.fixture(scope="module")
def server(record: Path) -> Iterator[Server]:
    env = {
        "SERVING_HANDLER": f"{HANDLERS / 'generating/knobs.py'}:Knobs",
        "SERVING_WORKERS": "1",
        "SERVING_WORKER_CLASS": "gthread",
        "SERVING_GRPC_PORT": str(free_port()),
        "GENERATING_RECORD": str(record),
    }
    with gunicorn_server(env) as running:
        running.grpc = f"127.0.0.1:{env['SERVING_GRPC_PORT']}"  # type: ignore[attr-defined]
        yield running
        log = running.output()
    # The one the mid-stream test breaks on purpose, and no other.
    broke = log.count("RuntimeError: the model broke mid-stream")
    assert log.count("Traceback") == broke, f"the server logged a traceback:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def proxy(server: Any) -> Iterator[str]:
    grpc_port = free_port()
    settings = {"NGINX_GRPC_PORT": str(grpc_port), "NGINX_GRPC_UPSTREAM": server.grpc}
    with nginx_server(server.bind, settings):
        yield f"127.0.0.1:{grpc_port}"


@pytest.fixture(params=["direct", "nginx"])
def target(request: pytest.FixtureRequest, server: Any) -> str:
    return str(server.grpc if request.param == "direct" else request.getfixturevalue("proxy"))


class Stream:
    """tritonclient's stream, its callback's results and errors in one queue."""

    def __init__(self, target: str) -> None:
        self.client = grpcclient.InferenceServerClient(target)
        self.got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.got.put((result, error)))

    def send(self, request_id: str, **params: Any) -> None:
        inputs = []
        for name, value in params.items():
            if isinstance(value, str):
                tensor = grpcclient.InferInput(name, [1], "BYTES")
                tensor.set_data_from_numpy(np.array([value.encode()], dtype=object))
            elif isinstance(value, float):
                tensor = grpcclient.InferInput(name, [1], "FP64")
                tensor.set_data_from_numpy(np.array([value], dtype=np.float64))
            else:
                tensor = grpcclient.InferInput(name, [1], "INT64")
                tensor.set_data_from_numpy(np.array([value], dtype=np.int64))
            inputs.append(tensor)
        self.client.async_stream_infer(
            MODEL, inputs, request_id=request_id, enable_empty_final_response=True
        )

    def until_final(self) -> tuple[list[str], Any]:
        """The texts of one request's responses up to its final one, or its error."""
        texts: list[str] = []
        while True:
            result, error = self.got.get(timeout=WAIT_S)
            if error is not None:
                return texts, error
            response = result.get_response()
            if response.parameters["triton_final_response"].bool_param:
                assert not response.outputs
                return texts, None
            texts.append(result.as_numpy("text")[0].decode())

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(target: str) -> Iterator[Stream]:
    opened = Stream(target)
    yield opened
    opened.close()


def test_each_chunk_is_a_response_then_the_empty_final_one(stream: Stream) -> None:
    stream.send("one", prompt="alpha beta", n=3)
    assert stream.until_final() == ([" alpha", " beta", " alpha"], None)
    # The stream goes on: the next request on it is answered in turn.
    stream.send("two", n=2)
    assert stream.until_final() == ([" w0", " w1"], None)


def test_errors_are_responses_of_their_request_and_the_stream_goes_on(stream: Stream) -> None:
    stream.send("too-many", n=2, max_tokens=100_000)
    texts, error = stream.until_final()
    assert texts == []
    assert "SERVING_MAX_TOKENS" in error.message()
    stream.send("after", n=1)
    assert stream.until_final() == ([" w0"], None)


def test_a_generation_that_fails_mid_stream_ends_with_its_error(server: Any) -> None:
    opened = Stream(server.grpc)
    try:
        opened.send("breaks", n=6, fail_at=2)
        texts, error = opened.until_final()
    finally:
        opened.close()
    assert texts == [" w0", " w1"]
    assert "the model failed on this request" in error.message()


def gone(server: Any) -> float:
    text = requests.get(server.url + "/metrics", timeout=10).text
    found = re.search(r'^serving_generations_total\{reason="gone"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_cancelled_stream_stops_its_generation(server: Any, record: Path) -> None:
    opened = Stream(server.grpc)
    request_id = uuid.uuid4().hex
    before = gone(server)
    opened.send(request_id, n=1000, max_tokens=256, step_s=0.05)
    result, error = opened.got.get(timeout=WAIT_S)
    assert error is None
    assert result.as_numpy("text")[0] == b" w0"
    opened.client.stop_stream(cancel_requests=True)
    opened.client.close()
    wait_for(lambda: gone(server) > before, "the cancel noticed", timeout_s=WAIT_S)
    # Another generation runs after it: the decoder has moved past the one that left.
    after = requests.post(server.url + "/predict", json={"n": 2}, timeout=WAIT_S)
    assert after.json() == {"text": " w0 w1"}
    lines = record.read_text().splitlines()
    steps = sum(request_id in json.loads(line)["ids"] for line in lines)
    # Its first step, and the one in progress when the cancel came, of its 256.
    assert steps <= 2
