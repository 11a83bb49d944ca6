"""The README's path, as a new user walks it: ``serving-core init``, a real model in the
skeleton, ``make serve``, and ``make contracts`` (what ``make check`` and ``make test`` run
on every handler),
which fails with a message saying how to fix a handler that breaks the contract."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import textwrap
import time

import pytest
import requests

from tests.servers import ROOT, SERVING_CORE, base_env, free_port

pytestmark = pytest.mark.e2e

# What the user writes into the skeleton: a scikit-learn classifier, trained in
# setup() (in the master, before fork) on a few labelled sentences.
SENTIMENT = textwrap.dedent(
    """
    from __future__ import annotations

    from typing import Any

    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    from serving_core import Handler

    POSITIVE = ["I love it", "great service", "what a wonderful day", "excellent and fast",
                "really happy with this", "good value, works well", "amazing quality"]
    NEGATIVE = ["I hate it", "terrible service", "what an awful day", "slow and broken",
                "really unhappy with this", "bad value, never works", "horrible quality"]


    class Sentiment(Handler):
        name = "sentiment"
        version = "1"
        input_schema = {
            "type": "object",
            "properties": {"text": {"type": "string", "minLength": 1}},
            "required": ["text"],
        }

        def setup(self) -> None:
            self.model = make_pipeline(TfidfVectorizer(), LogisticRegression(C=10.0))
            self.model.fit(POSITIVE + NEGATIVE, [1] * len(POSITIVE) + [0] * len(NEGATIVE))

        def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
            scores = self.model.predict_proba([params["text"] for params in batch])[:, 1]
            return [
                {"label": "positive" if p >= 0.5 else "negative", "score": float(p)}
                for p in scores
            ]
    """
)


def run(command, *, env=None, timeout=300):
    return subprocess.run(
        command,
        cwd=ROOT,
        env=base_env(env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextlib.contextmanager
def make_serve(env, log_path):
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "serve"],
            cwd=ROOT,
            env=base_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def wait_ready(url, process, log_path, timeout_s=180.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"make serve exited with {process.returncode}:\n{log_path.read_text()}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url + "/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    pytest.fail(f"make serve was not ready after {timeout_s} s:\n{log_path.read_text()}")


def test_init_a_real_model_make_serve_and_make_check(tmp_path):
    # 1. serving-core init sentiment
    result = run([str(SERVING_CORE), "init", "sentiment", "--dir", str(tmp_path)])
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "sentiment"

    # 2. the user's model, its requirement and a sample request
    (folder / "handler.py").write_text(SENTIMENT)
    (folder / "requirements.txt").write_text("scikit-learn\n")
    (folder / "sample.json").write_text(json.dumps({"text": "great service, I love it"}))

    # 3. SERVING_HANDLER=handlers/sentiment make serve
    port = free_port()
    env = {
        "SERVING_HANDLER": str(folder),
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_WORKERS": "1",
    }
    url = f"http://127.0.0.1:{port}"
    with make_serve(env, tmp_path / "serve.log") as process:
        wait_ready(url, process, tmp_path / "serve.log")
        happy = requests.post(
            url + "/predict", json={"text": "a wonderful, excellent day"}, timeout=30
        )
        sad = requests.post(url + "/predict", json={"text": "awful and broken"}, timeout=30)
        missing = requests.post(url + "/predict", json={"txt": "typo"}, timeout=30)
    assert happy.status_code == 200, happy.text
    assert happy.json()["label"] == "positive"
    assert sad.json()["label"] == "negative"
    assert 0.0 <= sad.json()["score"] < 0.5
    assert missing.status_code == 400

    # 4. make contracts (make check and make test run it over handlers/*) passes ...
    checked = run(["make", "--no-print-directory", "contracts", f"HANDLERS={folder}"])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"serving-core check {folder}" in checked.stdout

    # ... and fails, saying how to fix it, once predict_batch drops an output.
    (folder / "handler.py").write_text(
        SENTIMENT.replace("for p in scores\n", "for p in scores[:-1]\n")
    )
    broken = run(["make", "--no-print-directory", "contracts", f"HANDLERS={folder}"])
    assert broken.returncode != 0
    assert "Sentiment.predict_batch returned 0 outputs for 1 inputs" in broken.stderr
    assert "return exactly one output per input, in the same order" in broken.stderr
    assert f"the handler in {folder} failed its check" in broken.stderr
