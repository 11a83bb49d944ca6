"""One request through nginx, a serial pipeline and its gRPC stage is one trace.

The seed's prep→pred pattern as a user runs it: nginx in front of
``handlers/minilm-prep-pred``, whose stages are ``handlers/minilm-prep`` over
HTTP and ``handlers/minilm-ids`` over V2 gRPC, four real processes exporting
to one OTLP receiver.
"""

from __future__ import annotations

import contextlib

import pytest
import requests

from tests.nginx_server import nginx_server
from tests.otlp_receiver import Received, Receiver, tracing_env, waterfall
from tests.servers import ROOT, free_port, gunicorn_server

pytestmark = [pytest.mark.e2e, pytest.mark.model]

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
GRPC_INFER = "inference.GRPCInferenceService/ModelInfer"


def child(spans: list[Received], parent: Received, name: str) -> Received:
    found = [s for s in spans if s.parent_id == parent.span_id and s.name == name]
    assert len(found) == 1, (name, [(s.name, s.parent_id) for s in spans])
    return found[0]


@pytest.mark.example("minilm", "minilm-prep", "minilm-ids", "minilm-prep-pred")
def test_nginx_a_pipeline_and_its_grpc_stage_give_one_trace(otlp: Receiver) -> None:
    one = {"SERVING_WORKERS": "1", "SERVING_LOG_FORMAT": "json"}
    gthread = {"SERVING_WORKER_CLASS": "gthread", **one}
    grpc_port = free_port()
    with contextlib.ExitStack() as stack:
        prep = stack.enter_context(
            gunicorn_server(tracing_env(otlp, SERVING_HANDLER="handlers/minilm-prep", **one))
        )
        pred_env = tracing_env(
            otlp,
            SERVING_HANDLER="handlers/minilm-ids",
            SERVING_GRPC_PORT=str(grpc_port),
            **gthread,
        )
        pred = stack.enter_context(gunicorn_server(pred_env))
        pair_env = tracing_env(
            otlp,
            SERVING_HANDLER="handlers/minilm-prep-pred",
            MINILM_PREP_URL=prep.url,
            MINILM_IDS_GRPC=f"127.0.0.1:{grpc_port}",
            **gthread,
        )
        pair = stack.enter_context(gunicorn_server(pair_env))
        nginx = stack.enter_context(nginx_server(pair.bind))
        # A first request of its own trace: the drawn one shows the services warm (the
        # gRPC stage's model metadata fetched, each model's first call made).
        warm = {"text": "warming up"}
        assert requests.post(nginx.url + "/predict", json=warm, timeout=60).status_code == 200
        answer = requests.post(
            nginx.url + "/predict",
            json={"text": "Paris is the capital of France."},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        spans = otlp.wait_for(
            lambda spans: (
                (trace := [s for s in spans if s.trace_id == CLIENT_TRACE])
                and len([s for s in trace if s.name == "model"]) == 3
                and len([s for s in trace if s.kind == "server"]) == 3
                and trace
            ),
            "the three services' spans of the request",
        )
        logged = nginx.access_entry(answer.headers["X-Request-ID"])
        pred_log = pred.output()
    # What docs/observability.md draws, from this run.
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "trace-waterfall.txt").write_text(waterfall(spans) + "\n")
    # The pipeline's request, under the client's span.
    (front,) = [s for s in spans if s.parent_id == CLIENT_SPAN]
    assert (front.name, front.kind) == ("POST /predict", "server")
    assert front.resource["serving.model.name"] == "all-minilm-l6-v2-prep-pred"
    batch = child(spans, front, "model")
    # Each stage call is a client span under the pipeline's batch, and the stage's own
    # server span is its child: over HTTP (prep) and over gRPC (pred).
    prep_call = child(spans, batch, "stage prep")
    assert prep_call.kind == "client"
    prep_served = child(spans, prep_call, "POST /predict")
    assert prep_served.resource["serving.model.name"] != front.resource["serving.model.name"]
    child(spans, prep_served, "model")
    pred_call = child(spans, batch, "stage pred")
    assert pred_call.attributes["serving.stage.protocol"] == "grpc"
    pred_served = child(spans, pred_call, GRPC_INFER)
    assert pred_served.kind == "server"
    assert pred_served.attributes["rpc.method"] == "ModelInfer"
    for step in ("admission", "read", "queue", "model"):
        child(spans, pred_served, step)
    # Nested in time as in the tree.
    assert front.start_ns <= batch.start_ns <= prep_call.start_ns < pred_call.start_ns
    assert pred_call.start_ns <= pred_served.start_ns <= pred_served.end_ns <= pred_call.end_ns
    assert pred_call.end_ns <= batch.end_ns <= front.end_ns
    # The trace id is in nginx's access line and in the gRPC stage's.
    assert logged["trace_id"] == CLIENT_TRACE
    assert f'"trace_id":"{CLIENT_TRACE}"' in pred_log.replace(" ", "")
