"""Traces of jobs: a real server, a real ``serving-core worker`` and a real OTLP receiver.

A job submitted with a client's ``traceparent`` is one trace from the submit to
the worker's run: ``POST /jobs`` → ``job submit`` (producer) → ``job run``
(consumer, in the worker) → ``model`` (linked to the run).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.otlp_receiver import Received, Receiver, tracing_env
from tests.servers import gunicorn_server, job_worker, wait_for

pytestmark = pytest.mark.e2e

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


def _one(spans: list[Received], name: str) -> Received:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [(s.name, s.span_id) for s in spans])
    return found[0]


def _job_done(url: str, job_id: str) -> dict[str, object]:
    def done() -> dict[str, object] | None:
        job: dict[str, object] = requests.get(f"{url}/jobs/{job_id}", timeout=10).json()
        return job if job["status"] == "done" else None

    return wait_for(done, f"job {job_id} to be done", 60)


def test_a_job_runs_in_its_submitters_trace_with_the_model_span_linked(
    otlp: Receiver, tmp_path: Path
) -> None:
    env = tracing_env(
        otlp,
        SERVING_HANDLER="tests/handlers/probe",
        SERVING_WORKERS="1",
        SERVING_JOBS_ENABLED="true",
        SERVING_JOBS_PATH=str(tmp_path / "jobs.db"),
    )
    with gunicorn_server(env) as server, job_worker(env, tmp_path):
        answer = requests.post(
            server.url + "/jobs",
            json={"text": "hi"},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=10,
        )
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job_id"]
        assert _job_done(server.url, job_id)["result"]
        spans = otlp.wait_for(
            lambda spans: (
                {"job run", "model", "postprocess"}
                <= {s.name for s in spans if s.trace_id == CLIENT_TRACE}
                and spans
            ),
            "the job's spans in the client's trace",
        )
    trace = [s for s in spans if s.trace_id == CLIENT_TRACE]
    request = _one(trace, "POST /jobs")
    assert request.parent_id == CLIENT_SPAN
    submit = _one(trace, "job submit")
    assert (submit.kind, submit.parent_id) == ("producer", request.span_id)
    assert submit.attributes["serving.job_id"] == job_id
    run = _one(trace, "job run")
    assert (run.kind, run.parent_id) == ("consumer", submit.span_id)
    assert run.attributes["serving.job_id"] == job_id
    assert run.attributes["messaging.destination.name"] == "probe"
    # The worker's process, not the server's: another pid in its resource.
    assert run.resource["process.pid"] != request.resource["process.pid"]
    assert run.resource["serving.model.name"] == "probe"
    model = _one(trace, "model")
    assert model.parent_id == run.span_id
    assert model.links == ((CLIENT_TRACE, run.span_id),)
    for step in ("preprocess", "postprocess"):
        assert _one(trace, step).parent_id == run.span_id, step
    assert run.start_ns <= model.start_ns <= model.end_ns <= run.end_ns


def test_a_follow_up_job_runs_in_the_requests_trace(otlp: Receiver, tmp_path: Path) -> None:
    env = tracing_env(
        otlp,
        SERVING_HANDLER="tests/handlers/probe",
        SERVING_WORKERS="1",
        SERVING_FOLLOWUP_QUEUE="probe",
        SERVING_JOBS_PATH=str(tmp_path / "jobs.db"),
    )
    with gunicorn_server(env) as server, job_worker(env, tmp_path):
        answer = requests.post(
            server.url + "/predict",
            json={"text": "later"},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        job_id = answer.json()["job_id"]
        _job_done(server.url, job_id)
        spans = otlp.wait_for(
            lambda spans: (
                [s for s in spans if s.trace_id == CLIENT_TRACE and s.name == "job run"] and spans
            ),
            "the follow-up's run in the request's trace",
        )
    trace = [s for s in spans if s.trace_id == CLIENT_TRACE]
    request = _one(trace, "POST /predict")
    submit = _one(trace, "job submit")
    assert submit.parent_id == request.span_id
    run = _one(trace, "job run")
    assert run.parent_id == submit.span_id
    assert run.attributes["serving.job_id"] == job_id
