"""The one preload (``serving_core.preload``), as each command's forked processes see it.

``serve``, ``worker`` and ``batch`` run the same steps in their master: torch at
one thread, ``setup()``, torch at one thread again, ``gc.collect()``,
``gc.freeze()``, then fork. The handler (tests/handlers/preload) records, in the
master, its torch threads as ``setup()`` starts and as each fork begins, and
whether the garbage its ``setup()`` left was freed; each command's forked
process answers with what it inherited.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
import requests

from serving_core.jobs.backends import open_queue
from serving_core.settings import Settings
from tests.conftest import HANDLERS
from tests.servers import ROOT, SERVING_CORE, base_env, gunicorn_server, job_worker

pytestmark = pytest.mark.e2e

pytest.importorskip("torch", reason="no handler here installs torch")

HANDLER = str(HANDLERS / "preload" / "handler.py")


def served(tmp_path):
    with gunicorn_server({"SERVING_HANDLER": HANDLER, "SERVING_WORKERS": "1"}) as server:
        response = requests.post(server.url + "/predict", json={}, timeout=30)
        log = server.output()
    assert response.status_code == 200, response.text
    # The worker's own share after fork: every usable core, for one worker, which
    # has no sibling to borrow from.
    assert re.search(r"worker \d+ ready: \d+ torch thread\(s\)$", log, re.M), log
    return response.json()


def consumed(tmp_path):
    env = {"SERVING_HANDLER": HANDLER, "SERVING_WORKERS": "1"}
    env["SERVING_JOBS_PATH"] = str(tmp_path / "jobs.db")
    queue = open_queue(Settings.from_env(env), "preloadprobe")
    try:
        job_id = queue.submit({}).id
        with job_worker(env, tmp_path):
            deadline = time.monotonic() + 60
            while (job := queue.get(job_id)) is not None and job.status != "done":
                assert time.monotonic() < deadline, f"the job is still {job.status}"
                time.sleep(0.05)
    finally:
        queue.close()
    assert job is not None
    return job.result


def batched(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"id": 1}\n')
    out = tmp_path / "out.jsonl"
    flags = ["--handler", HANDLER, "--workers", "1", "--input", str(tmp_path / "in.jsonl")]
    result = subprocess.run(
        [str(SERVING_CORE), "batch", *flags, "--output", str(out)],
        cwd=ROOT,
        env=base_env({}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())["output"]


@pytest.mark.parametrize("command", [served, consumed, batched], ids=["serve", "worker", "batch"])
def test_each_command_caps_torch_around_setup_then_collects_and_freezes_before_fork(
    tmp_path, command
):
    seen = command(tmp_path)
    assert seen["threads_in_setup"] == 1  # capped before setup()
    assert seen["threads_at_fork"] == 1  # capped again after setup() raised it to 2
    assert seen["garbage_freed"] is True  # collected before the freeze would keep it
    assert seen["frozen_at_fork"] > 0
