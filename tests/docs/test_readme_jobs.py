"""docs/jobs.md's blocks, run whole as written in a real bash: the API and its worker
started by the block itself, which also waits for them (the runner adds no wait), the
job submitted and read back with its curl lines (tests/docs/test_readme.py says how
blocks are run)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from tests import readme
from tests.docs.test_readme import ACTIVATE, ported, session_env
from tests.readme import block_with, shell
from tests.servers import ROOT, free_port

pytestmark = pytest.mark.e2e
POLL_TIMEOUT_S = 240.0  # a bound on waiting for a job, never an expected time


def wait_for_status(url: str, wanted: str) -> dict[str, object]:
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while True:
        job: dict[str, object] = requests.get(url, timeout=10).json()
        if job["status"] == wanted or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def test_the_jobs_example_runs_the_job_through_its_worker(tmp_path: Path) -> None:
    project = readme.project(tmp_path / "project")
    (project / "handlers" / "sentiment").mkdir(parents=True)
    readme.put_the_readme_handler(project / "handlers" / "sentiment")
    (project / "handlers" / "sentiment" / "sample.json").write_text('{"text": "great"}\n')
    api, worker = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    # One process each is enough here; the block leaves SERVING_WORKERS to the machine.
    env = {**session_env(tmp_path, api), "SERVING_WORKERS": "1"}
    block = block_with("export SERVING_HANDLER=handlers/sentiment")
    with shell(project, env, tmp_path / "shell") as session:
        assert session.run(ACTIVATE).returncode == 0
        ran = session.run_block(ported(block.text, api, worker), ready=None)
        for each in ran:
            assert each.returncode == 0, f"{each}\n{session.server_logs()}"
        status = ran[-1]
        first = json.loads(status.output)
        assert first["status"] in ("queued", "running", "done"), first
        job_id = first["job_id"]
        done = wait_for_status(f"http://{api}/jobs/{job_id}", "done")
        metrics = requests.get(f"http://{api}/metrics", timeout=10).text
    assert done["status"] == "done", done
    assert done["result"] in ({"label": "positive"}, {"label": "negative"})
    assert "hint" not in done
    assert 'serving_job_consumers{queue="sentiment"} 1.0' in metrics


@pytest.mark.model
@pytest.mark.example("hashembed", "minilm")
def test_the_time_lag_example_answers_now_and_fills_in_later(tmp_path: Path) -> None:
    api, worker = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {**session_env(tmp_path, api), "SERVING_WORKERS": "1"}
    block = block_with("SERVING_FOLLOWUP_QUEUE=all-minilm-l6-v2 serving-core serve &")
    with shell(ROOT, env, tmp_path / "shell") as session:
        assert session.run(ACTIVATE).returncode == 0
        *waited, answer = session.run_block(ported(block.text, api, worker), ready=None)
        for each in [*waited, answer]:
            assert each.returncode == 0, f"{each}\n{session.server_logs()}"
        now = json.loads(answer.output)
        assert len(now["embedding"]) == 384  # the fast handler's, at once
        later = wait_for_status(f"http://{api}{now['status_url']}", "done")
    assert later["status"] == "done", later
    assert len(later["result"]["embedding"]) == 384  # MiniLM's, filled in by the worker
    assert later["result"]["embedding"] != now["embedding"]
