"""Traces of ``serving-core batch``: the real CLI in a subprocess, a real OTLP receiver.

One run is one ``batch`` span (a child of the ``TRACEPARENT`` it was started
with), a ``chunk`` span per chunk under it, and the workers' ``model`` spans
under their chunks.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.otlp_receiver import Receiver, tracing_env
from tests.servers import ROOT, SERVING_CORE, base_env

pytestmark = pytest.mark.e2e

RUN_TRACE = "a3ce929d0e0e47364bf92f3577b34da6"
RUN_SPAN = "53995c3f42cd8ad8"

HANDLER = """
from serving_core import Handler, InvalidInput


class Doubler(Handler):
    name = "doubler"

    def predict_batch(self, items):
        return [
            InvalidInput("n must not be negative") if item["n"] < 0 else {"double": 2 * item["n"]}
            for item in items
        ]
"""


def test_a_batch_run_is_one_span_with_a_span_per_chunk(otlp: Receiver, tmp_path: Path) -> None:
    handler = tmp_path / "doubler"
    handler.mkdir()
    (handler / "handler.py").write_text(HANDLER)
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    numbers = [1, 2, 3, 4, -5, 6, 7]  # chunks of 3: 3, 3 (one fails) and 1
    source.write_text("".join(json.dumps({"id": str(n), "n": n}) + "\n" for n in numbers))
    env = tracing_env(otlp, TRACEPARENT=f"00-{RUN_TRACE}-{RUN_SPAN}-01")
    command = [str(SERVING_CORE), "batch", "--handler", str(handler), "--workers", "2"]
    command += ["--input", str(source), "--output", str(out), "--chunk-size", "3"]
    run = subprocess.run(
        command,
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 1, run.stderr  # one record failed
    assert len(out.read_text().splitlines()) == len(numbers)
    # Each worker sent its spans as the pool closed, before the run ended.
    spans = [s for s in otlp.spans() if s.trace_id == RUN_TRACE]
    (batch,) = [s for s in spans if s.name == "batch"]
    assert batch.parent_id == RUN_SPAN
    assert batch.attributes["serving.records_written"] == len(numbers)
    assert batch.attributes["serving.records_failed"] == 1
    assert batch.attributes["process.exit.code"] == 1
    chunks = {s.span_id: s for s in spans if s.name == "chunk"}
    assert {s.parent_id for s in chunks.values()} == {batch.span_id}
    assert sorted(s.attributes["serving.chunk_size"] for s in chunks.values()) == [1, 3, 3]
    assert sorted(s.attributes["serving.chunk_failed"] for s in chunks.values()) == [0, 0, 1]
    models = [s for s in spans if s.name == "model"]
    assert len(models) == 3
    for model in models:
        # Run in a worker, under its chunk, linked to it once (its records share it).
        assert model.parent_id in chunks
        assert model.links == ((RUN_TRACE, model.parent_id),)
        assert model.resource["process.pid"] != batch.resource["process.pid"]
        chunk = chunks[model.parent_id]
        assert chunk.start_ns <= model.start_ns <= model.end_ns <= chunk.end_ns
    assert {m.parent_id for m in models} == set(chunks)
    # Each record's preprocess is in the trace too, under its chunk.
    preprocess = [s for s in spans if s.name == "preprocess"]
    assert len(preprocess) == len(numbers)
    assert {s.parent_id for s in preprocess} == set(chunks)
