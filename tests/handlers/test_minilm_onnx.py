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
from tests.conftest import example_module
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
def handlers(cache: Path):
    """Both handlers set up in this process; the ONNX one exports into ``cache``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINILM_ONNX_CACHE", str(cache))
        loaded = [load_handler(str(ROOT / "handlers" / name)) for name in ("minilm", "minilm-onnx")]
        for one in loaded:
            one.handler.setup()
            one.handler.setup_worker()
    return [one.handler for one in loaded]


def embeddings(handler, texts: list[str]) -> np.ndarray:
    rows = handler.predict_batch([{"text": text} for text in texts])
    return np.stack([row["embedding"] for row in rows])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_a_padded_batch_matches_the_torch_handler(handlers) -> None:
    torch_handler, onnx_handler = handlers
    onnx_rows = embeddings(onnx_handler, TEXTS)
    assert onnx_rows.dtype == np.float32
    assert onnx_rows.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(np.linalg.norm(onnx_rows, axis=1), 1.0, atol=1e-5)
    assert cosines(onnx_rows, embeddings(torch_handler, TEXTS)).min() >= 0.9999
    # Padding changes nothing: each sentence alone (no padding) as in the batch.
    alone = np.concatenate([embeddings(onnx_handler, [t]) for t in TEXTS])
    assert cosines(alone, onnx_rows).min() >= 0.9999


def test_gunicorn_workers_reuse_the_cached_graph_and_serve_it(handlers, cache: Path) -> None:
    torch_handler = handlers[0]
    (exported,) = cache.glob("*.onnx")  # exported once, by the in-process setup
    overrides = {
        "SERVING_HANDLER": "handlers/minilm-onnx",
        "SERVING_WORKERS": "2",  # sessions made in forked workers, not in the master
        "MINILM_ONNX_CACHE": str(cache),
    }
    with gunicorn_server(overrides) as server:
        barrier = threading.Barrier(len(TEXTS))

        def client(text: str) -> requests.Response:
            barrier.wait()
            return requests.post(server.url + "/predict", json={"text": text}, timeout=60)

        with ThreadPoolExecutor(len(TEXTS)) as pool:
            responses = list(pool.map(client, TEXTS))
        log = server.output()
    assert [r.status_code for r in responses] == [200] * len(TEXTS), log
    served = np.array([r.json()["embedding"] for r in responses], dtype=np.float32)
    assert cosines(served, embeddings(torch_handler, TEXTS)).min() >= 0.9999
    assert f"the ONNX graph cached at {exported}" in log
    assert "exporting to ONNX" not in log
    assert list(cache.glob("*.onnx")) == [exported]
