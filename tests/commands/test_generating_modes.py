"""A generating handler on every path that answers in one piece: the job worker,
``serving-core batch``, the stream worker and a pipeline's stage each get the whole
generation, its chunks collected by ``Handler.collect``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests
import yaml

from tests.servers import ROOT, SERVING_CORE, base_env, gunicorn_server, job_worker, wait_for
from tests.stream.redis_broker import RedisBroker
from tests.stream.test_stream_worker import stream_worker

pytestmark = pytest.mark.e2e

HANDLER = str(ROOT / "tests/handlers/generating/handler.py")
WAIT_S = 60.0


def test_serving_core_batch_collects_each_generation(tmp_path: Path) -> None:
    rows = [{"prompt": "one two", "n": 3}, {"n": 2}, {"n": 4, "max_tokens": 2}, {"n": 0}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    command = [str(SERVING_CORE), "batch", "--handler", HANDLER, "--workers", "1"]
    run = subprocess.run(
        [*command, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")],
        cwd=ROOT,
        env=base_env({}),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    by_id = {row["id"]: row for row in out}
    assert len(by_id) == 4, run.stderr
    texts = [by_id[i].get("output", {}).get("text") for i in range(4)]
    assert texts[:3] == [" one two one", " w0 w1", " w0 w1"]
    assert by_id[3]["error"]["type"] == "invalid_input"  # n: 0 breaks the schema


def test_a_job_gets_the_whole_generation(tmp_path: Path) -> None:
    env = {"SERVING_HANDLER": HANDLER, "SERVING_WORKERS": "1"}
    queue = {"SERVING_JOBS_PATH": str(tmp_path / "jobs.db")}
    with gunicorn_server({**env, **queue}) as server, job_worker({**env, **queue}, tmp_path):
        submitted = requests.post(server.url + "/jobs", json={"n": 3}, timeout=10).json()
        status_url = server.url + submitted["status_url"]

        def done() -> dict[str, object] | None:
            job = requests.get(status_url, timeout=10).json()
            return job if job["status"] == "done" else None

        job = wait_for(done, "the job done", timeout_s=WAIT_S)
    assert job["result"] == {"text": " w0 w1 w2"}


def test_the_stream_worker_publishes_the_whole_generation(tmp_path: Path) -> None:
    with RedisBroker() as broker:
        broker.produce([("m1", json.dumps({"n": 3}), {}), ("m2", json.dumps({"n": 1}), {})])
        with stream_worker(broker, tmp_path, SERVING_HANDLER=HANDLER):
            wait_for(lambda: len(broker.results()) >= 2, "two results", timeout_s=WAIT_S)
        results = {mid: json.loads(body) for mid, body, _ in broker.results()}
    assert results == {"m1": {"text": " w0 w1 w2"}, "m2": {"text": " w0"}}


def test_a_pipeline_stage_gets_the_whole_generation(tmp_path: Path) -> None:
    folder = tmp_path / "pipeline"
    folder.mkdir()
    spec = {"kind": "serial", "stages": [{"name": "gen", "url_env": "GEN_URL"}]}
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(spec))
    with gunicorn_server({"SERVING_HANDLER": HANDLER, "SERVING_WORKERS": "1"}) as generator:
        env = {"SERVING_HANDLER": str(folder), "GEN_URL": generator.url, "SERVING_WORKERS": "1"}
        with gunicorn_server(env) as pipeline:
            answer = requests.post(pipeline.url + "/predict", json={"n": 2}, timeout=WAIT_S)
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"] == " w0 w1"
