"""The time-lag pattern (seed 002 §4.9) with two real handlers: a hashed-n-gram embedding
answers /predict at once, and all-MiniLM-L6-v2, run by `serving-core worker`, puts the
better embedding at the answer's status_url."""

from __future__ import annotations

import math
import time

import pytest
import requests

from tests.servers import ROOT, gunicorn_server, job_worker

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("hashembed", "minilm")]


def test_predict_answers_fast_and_the_slow_result_appears_at_status_url(tmp_path):
    queue = {"SERVING_JOBS_PATH": str(tmp_path / "jobs.db")}  # one file: the embedded queue
    web = {
        "SERVING_HANDLER": str(ROOT / "handlers/hashembed/handler.py"),
        "SERVING_FOLLOWUP_QUEUE": "all-minilm-l6-v2",
        "SERVING_WORKERS": "1",
        **queue,
    }
    slow = {
        "SERVING_HANDLER": str(ROOT / "handlers/minilm/handler.py"),
        "SERVING_WORKERS": "1",
        **queue,
    }
    text = "Paris is the capital of France."
    with gunicorn_server(web) as server:
        fast = requests.post(server.url + "/predict", json={"text": text}, timeout=10)
        assert fast.status_code == 200
        answer = fast.json()
        # The quick answer is there now; nothing has run the slow handler yet.
        assert len(answer["embedding"]) == 384
        queued = requests.get(server.url + answer["status_url"], timeout=10).json()
        assert queued["status"] == "queued"
        with job_worker(slow, tmp_path):
            deadline = time.monotonic() + 120
            while (job := requests.get(server.url + answer["status_url"], timeout=10).json())[
                "status"
            ] != "done":
                assert job["status"] in ("queued", "running"), job
                assert time.monotonic() < deadline, "no slow result in 120 s"
                time.sleep(0.1)
    better = job["result"]["embedding"]
    assert len(better) == 384
    assert math.isclose(math.sqrt(sum(x * x for x in better)), 1.0, rel_tol=1e-5)
    assert better != answer["embedding"]  # a different (the real) model's vector
