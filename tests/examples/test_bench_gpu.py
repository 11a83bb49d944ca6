"""bench/gpu.py, the GPU figures' script, run end to end on the CPU so that it cannot rot
between the sessions that have a GPU. The figures themselves are not checked: a bench
measures, tests do not."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.servers import ROOT, base_env

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.example("minilm")]


def test_the_gpu_bench_measures_the_bare_model_both_modes_and_the_noop_ceiling_on_the_cpu():
    tiny = ["--seconds", "1", "--batch", "2", "--workers", "1", "--concurrency", "2"]
    result = subprocess.run(
        [sys.executable, "bench/gpu.py", "--device", "cpu", "--dtype", "float32", *tiny],
        cwd=ROOT,
        env=base_env({}),
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    bare = [row for row in rows if row["measure"] == "bare"]
    served = [row for row in rows if row["measure"] == "served"]
    assert [row["batch"] for row in bare] == [2]
    assert bare[0]["sentences_per_s"] > 0
    assert bare[0]["tokenize_ms"] > 0
    assert [row["mode"] for row in served] == ["per-worker", "shared", "noop"]
    for row in served:
        assert row["req_per_s"] > 0, row
        assert set(row["statuses"]) == {"200"}, row
    # The batch figures come from /metrics, where the shared model process's are too.
    assert all(row["mean_batch"] for row in served[:2]), served
    assert "| mode | workers | concurrency | req_per_s |" in result.stdout
