"""handlers/minilm off the CPU: it tokenises in ``preprocess``, where the requests run,
and its model pads the ids (with SERVING_MODEL_PROCESS=shared the one model process
then only runs the model). SERVING_DEVICE=auto takes that path on this CPU machine:
its answers, served through a shared model process, are the CPU path's."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from serving_core.loading import load_handler
from tests.servers import gunicorn_server

pytestmark = [pytest.mark.e2e, pytest.mark.model]

TEXTS = [
    "Paris is the capital of France.",
    "x",
    "A man is playing a guitar on the street while the crowd, mostly tourists, listens.",
    "déjà vu — 東京 🚀",
    "the same words " * 100,  # past 256 tokens: truncated as the CPU path truncates
    "Short.",
]


def test_off_the_cpu_minilm_tokenises_in_preprocess_and_answers_as_on_the_cpu() -> None:
    on_cpu = load_handler("handlers/minilm", device="cpu", dtype="float32").handler
    on_cpu.setup()
    on_cpu.setup_worker()
    expected = [row["embedding"] for row in on_cpu.predict_batch([{"text": t} for t in TEXTS])]

    off = load_handler("handlers/minilm", device="auto", dtype="float32").handler
    off.setup()
    ids = off.preprocess({"text": TEXTS[1]})
    assert isinstance(ids, list), ids
    assert all(isinstance(i, int) for i in ids), ids

    overrides = {
        "SERVING_DEVICE": "auto",
        "SERVING_MODEL_PROCESS": "shared",
        "SERVING_WORKERS": "2",
    }
    with gunicorn_server(overrides, ready_timeout_s=180) as server:
        barrier = threading.Barrier(len(TEXTS))

        def client(text: str) -> requests.Response:
            barrier.wait()  # together: one padded batch of mixed lengths
            return requests.post(server.url + "/predict", json={"text": text}, timeout=60)

        with ThreadPoolExecutor(len(TEXTS)) as pool:
            responses = list(pool.map(client, TEXTS))
    for text, response, want in zip(TEXTS, responses, expected, strict=True):
        assert response.status_code == 200, (text, response.text)
        got = np.asarray(response.json()["embedding"], dtype=np.float32)
        np.testing.assert_allclose(got, want, atol=1e-4, err_msg=text)


@pytest.mark.example("minilm-ids")
def test_the_ids_handler_keeps_its_ids_off_the_cpu() -> None:
    """handlers/minilm-ids subclasses the embedder but receives ids: no tokenising preprocess."""
    ids = load_handler("handlers/minilm-ids", device="auto", dtype="float32").handler
    ids.setup()
    ids.setup_worker()
    params = {"input_ids": [101, 3000, 102]}
    assert ids.preprocess(params) is params
    (row,) = ids.predict_batch([ids.preprocess(params)])
    assert np.asarray(row["embedding"]).shape == (384,)
