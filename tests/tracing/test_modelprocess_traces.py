"""Traces through the shared model process (SERVING_MODEL_PROCESS=shared): the batch's
``model`` span, drawn in the model process, is in the request's trace and linked to it;
the worker draws the request's ``queue`` span up to that batch's start."""

from __future__ import annotations

import pytest
import requests

from tests.otlp_receiver import Receiver, tracing_env
from tests.servers import ROOT, gunicorn_server

pytestmark = pytest.mark.e2e

CLIENT_TRACE = "8448eb211c80319c0af7651916cd43dd"
CLIENT_SPAN = "69203331b7ad6b71"


def test_the_model_processs_batch_span_links_to_the_request(otlp: Receiver) -> None:
    env = tracing_env(
        otlp,
        SERVING_HANDLER=str(ROOT / "tests/handlers/shared/handler.py"),
        SERVING_MODEL_PROCESS="shared",
        SERVING_WORKERS="1",
        SERVING_CACHE_SIZE="0",
    )
    with gunicorn_server(env) as server:
        answer = requests.post(
            server.url + "/predict",
            json={"text": "hi"},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        spans = otlp.wait_for(
            lambda spans: (
                {"POST /predict", "model", "queue"}
                <= {s.name for s in spans if s.trace_id == CLIENT_TRACE}
                and spans
            ),
            "the request's, the model process's and the queue's spans",
        )
    trace = {s.name: s for s in spans if s.trace_id == CLIENT_TRACE}
    request, model, queue = trace["POST /predict"], trace["model"], trace["queue"]
    assert model.parent_id == request.span_id
    assert model.links == ((CLIENT_TRACE, request.span_id),)
    assert model.resource["process.pid"] == answer.json()["model_pid"]
    assert request.resource["process.pid"] == answer.json()["worker_pid"]
    # The worker's queue span: from its hand-over to the batch's start, linked to it.
    assert queue.parent_id == request.span_id
    assert queue.links == ((CLIENT_TRACE, model.span_id),)
    assert queue.start_ns <= queue.end_ns <= model.start_ns + 1_000_000
