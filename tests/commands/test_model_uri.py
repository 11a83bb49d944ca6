"""SERVING_MODEL_URI on every command that loads the model: ``serve``, ``worker``,
``batch`` and ``check`` hand the handler the artifacts' directory before ``setup()``,
and the revision reaches the cache key, the access line and ``serving_model_info``.

A local folder is the URI here (used in place, never copied); the stores are
tests/artifacts' (S3 and HTTP servers).
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import requests

from tests.servers import ROOT, SERVING_CORE, base_env, gunicorn_server, job_worker, wait_for

HANDLER = str(ROOT / "tests" / "handlers" / "artifacts" / "handler.py")
BUILD = "build-7"

pytestmark = pytest.mark.e2e


@pytest.fixture
def weights(tmp_path):
    folder = tmp_path / "model"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "weights.txt").write_text("the weights")
    (folder / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    return folder


def revision_in(metrics: str) -> str:
    """The revision label of the one ``serving_model_info`` series."""
    found = re.findall(r'^serving_model_info\{[^}]*revision="([^"]*)"[^}]*\} 1\.0$', metrics, re.M)
    assert len(found) == 1, metrics
    return found[0]


def test_serve_hands_the_handler_its_artifacts_and_logs_their_revision(weights):
    env = {
        "SERVING_HANDLER": HANDLER,
        "SERVING_MODEL_URI": str(weights),
        "SERVING_MODEL_REVISION": BUILD,
        "SERVING_LOG_FORMAT": "json",
        "SERVING_WORKERS": "1",
    }
    with gunicorn_server(env) as server:
        answer = requests.post(server.url + "/predict", json={}, timeout=10).json()
        metrics = requests.get(server.url + "/metrics", timeout=10).text
        # The access line is written once the answer is sent: wait for it.
        output = wait_for(lambda: '"/predict"' in server.output() and server.output(), "the line")
    assert answer["weights"] == "the weights"
    assert answer["files"] == ["tokenizer/vocab.txt", "weights.txt"]
    assert answer["dir"] == str(weights)  # a local folder is used in place
    artifacts = answer["revision"]
    assert artifacts
    assert revision_in(metrics) == f"{BUILD}+{artifacts}"
    lines = [json.loads(line) for line in output.splitlines() if '"/predict"' in line]
    assert [line.get("model_revision") for line in lines] == [f"{BUILD}+{artifacts}"]


def test_the_text_access_line_has_the_revision_when_there_is_one(weights):
    env = {"SERVING_HANDLER": HANDLER, "SERVING_MODEL_URI": str(weights), "SERVING_WORKERS": "1"}
    with gunicorn_server(env) as server:
        revision = requests.post(server.url + "/predict", json={}, timeout=10).json()["revision"]
        wait_for(
            lambda: re.search(
                rf'"POST /predict HTTP/1.1" 200 .* model_revision={re.escape(revision)}$',
                server.output(),
                re.M,
            ),
            server.output,
        )


def test_a_changed_folder_is_a_new_revision(weights):
    env = {"SERVING_MODEL_URI": str(weights)}
    first = checked(env)
    assert "the weights" in first
    (weights / "weights.txt").write_text("retrained weights")
    second = checked(env)
    assert "retrained weights" in second
    assert revision_of(second) != revision_of(first)


def revision_of(printed):
    return re.search(r'"revision": ?"([^"]+)"', printed)[1]


def checked(env):
    """``serving-core check``'s run of the handler: what it printed (the answer)."""
    done = serving_core("check", HANDLER, "--params", "{}", env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_worker_fetches_before_preload(weights, tmp_path):
    env = {"SERVING_HANDLER": HANDLER, "SERVING_MODEL_URI": str(weights), "SERVING_WORKERS": "1"}
    with job_worker(env, tmp_path) as (_, url, _log):
        metrics = requests.get(url + "/metrics", timeout=10).text
    assert revision_in(metrics).startswith(("sha256:", "local:"))


def test_batch_fetches_before_preload(weights, tmp_path):
    rows = tmp_path / "in.jsonl"
    rows.write_text('{"id": "a"}\n')
    out = tmp_path / "out.jsonl"
    done = serving_core(
        *("batch", "--handler", HANDLER, "--input", str(rows), "--output", str(out)),
        *("--workers", "1"),
        env={"SERVING_MODEL_URI": str(weights)},
    )
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["output"]["weights"] == "the weights"


def test_a_missing_folder_stops_start_up_naming_it(tmp_path):
    missing = tmp_path / "nowhere"
    done = serving_core("check", HANDLER, "--params", "{}", env={"SERVING_MODEL_URI": str(missing)})
    assert done.returncode != 0
    assert str(missing) in done.stderr
    assert "Traceback" not in done.stderr


def serving_core(*args, env):
    """``serving-core ARGS`` run to its end, with ``env`` over the test's environment."""
    return subprocess.run(
        [str(SERVING_CORE), *args],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
