"""handlers/minilm-onnx: the ONNX export run by onnxruntime answers as handlers/minilm
(torch) does, in-process and through real gunicorn workers (sessions made after fork)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from serving_core.loading import load_handler
from tests.example_handlers import example_module
from tests.servers import ROOT, gunicorn_server

example_module("minilm-onnx", "onnxruntime")  # installed by its requirements alone

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("minilm", "minilm-onnx")]

TEXTS = [
    "Paris is the capital of France.",
    "x",
    "A man is playing a guitar on the street while the crowd, mostly tourists, listens.",
    "déjà vu — 東京 🚀",
    "the same words " * 100,  # past 256 tokens: truncated the same way in both
    "Short.",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("minilm-onnx-cache")


@pytest.fixture(scope="module")
def served(cache: Path):
    """TEXTS, sent at once to 2 gunicorn workers: the master exports the graph
    (the cache is empty), the forked workers make their sessions and answer."""
    overrides = {
        "SERVING_HANDLER": "handlers/minilm-onnx",
        "SERVING_WORKERS": "2",
        "MINILM_ONNX_CACHE": str(cache),
    }
    with gunicorn_server(overrides, ready_timeout_s=180) as server:
        barrier = threading.Barrier(len(TEXTS))

        def client(text: str) -> requests.Response:
            barrier.wait()
            return requests.post(server.url + "/predict", json={"text": text}, timeout=60)

        with ThreadPoolExecutor(len(TEXTS)) as pool:
            responses = list(pool.map(client, TEXTS))
        # The same texts through V2 (Open Inference Protocol), one request.
        v2 = requests.post(
            server.url + "/v2/models/all-minilm-l6-v2-onnx/infer",
            json={
                "inputs": [
                    {"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}
                ]
            },
            timeout=60,
        )
        return responses, v2, server.output()


def set_up(name: str, cache: Path):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINILM_ONNX_CACHE", str(cache))
        handler = load_handler(str(ROOT / "handlers" / name)).handler
        handler.setup()
        handler.setup_worker()
    return handler


@pytest.fixture(scope="module")
def torch_handler(cache: Path):
    return set_up("minilm", cache)


@pytest.fixture(scope="module")
def onnx_handler(served, cache: Path):
    """Set up in this process after the server exported: from the cached file."""
    (exported,) = cache.glob("*.onnx")
    before = exported.stat()
    handler = set_up("minilm-onnx", cache)
    after = exported.stat()
    # An export would have replaced the file (os.replace: a new inode).
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert list(cache.glob("*")) == [exported]
    return handler


def embeddings(handler, texts: list[str]) -> np.ndarray:
    rows = handler.predict_batch([{"text": text} for text in texts])
    return np.stack([row["embedding"] for row in rows])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_master_exports_and_two_forked_workers_serve_the_graph(served, torch_handler) -> None:
    responses, _, log = served
    assert [r.status_code for r in responses] == [200] * len(TEXTS), log
    assert "exporting to ONNX" in log
    assert "onnx_ir" not in log  # the exporter's hundred INFO lines kept out
    rows = np.array([r.json()["embedding"] for r in responses], dtype=np.float32)
    assert cosines(rows, embeddings(torch_handler, TEXTS)).min() >= 0.9999


def test_a_padded_batch_matches_the_torch_handler(torch_handler, onnx_handler) -> None:
    onnx_rows = embeddings(onnx_handler, TEXTS)
    assert onnx_rows.dtype == np.float32
    assert onnx_rows.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(onnx_rows, axis=1), 1.0, atol=1e-5)
    assert cosines(onnx_rows, embeddings(torch_handler, TEXTS)).min() >= 0.9999
    # Padding changes nothing: each sentence alone (no padding) as in the batch.
    alone = np.concatenate([embeddings(onnx_handler, [t]) for t in TEXTS])
    assert cosines(alone, onnx_rows).min() >= 0.9999


def test_v2_answers_the_declared_fp32_tensor_with_the_predict_embeddings(served) -> None:
    responses, v2, log = served
    assert v2.status_code == 200, log
    (output,) = v2.json()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == (
        "embedding",
        "FP32",
        [len(TEXTS), 384],
    )
    rows = np.array(output["data"], dtype=np.float32).reshape(len(TEXTS), 384)
    predicted = np.array([r.json()["embedding"] for r in responses], dtype=np.float32)
    np.testing.assert_allclose(rows, predicted, atol=1e-6)
