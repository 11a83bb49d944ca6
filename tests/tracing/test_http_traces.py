"""Traces of HTTP requests, from a real server to a real OTLP receiver."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import requests

from tests.otlp_receiver import Receiver, tracing_env
from tests.servers import gunicorn_server, wait_for

pytestmark = pytest.mark.e2e

PROBE = "tests/handlers/probe"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def probe_env(receiver: Receiver, **more: str) -> dict[str, str]:
    return tracing_env(
        receiver,
        SERVING_HANDLER=PROBE,
        SERVING_WORKERS="1",
        SERVING_LOG_FORMAT="json",
        **more,
    )


def test_a_request_is_one_trace_with_its_steps_under_the_clients_span(otlp: Receiver) -> None:
    with gunicorn_server(probe_env(otlp)) as server:
        answer = requests.post(
            server.url + "/predict",
            json={"text": "hi"},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        spans = otlp.wait_for(
            lambda spans: len([s for s in spans if s.trace_id == CLIENT_TRACE]) >= 8 and spans,
            "the request's eight spans",
        )
        access = wait_for(
            lambda: [
                json.loads(line)
                for line in server.output().splitlines()
                if line.startswith("{") and '"route"' in line and "/predict" in line
            ],
            "the access line",
        )
    trace = {s.name: s for s in spans if s.trace_id == CLIENT_TRACE}
    request = trace["POST /predict"]
    assert request.kind == "server"
    assert request.parent_id == CLIENT_SPAN
    assert request.attributes["http.route"] == "/predict"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["serving.request_id"] == answer.headers["X-Request-ID"]
    for step in ("admission", "read", "queue", "preprocess", "postprocess", "respond"):
        assert trace[step].parent_id == request.span_id, step
        assert request.start_ns <= trace[step].start_ns <= trace[step].end_ns <= request.end_ns
    # The batch: its own span, under the one request that rode in it, linked to it.
    model = trace["model"]
    assert model.parent_id == request.span_id
    assert model.links == ((CLIENT_TRACE, request.span_id),)
    assert model.attributes["serving.batch_size"] == 1
    assert trace["queue"].links == ((CLIENT_TRACE, model.span_id),)
    assert trace["queue"].end_ns <= model.start_ns + 1_000_000  # the wait ends as the batch starts
    # The response is sent last: from the app's answer to its last byte.
    assert trace["respond"].start_ns >= trace["postprocess"].end_ns
    assert trace["respond"].end_ns <= request.end_ns
    assert request.resource["serving.model.name"] == "probe"
    assert request.resource["serving.model.version"] == "7"
    # The client learns its request's span; the access line has the trace id.
    assert answer.headers["traceresponse"] == f"00-{CLIENT_TRACE}-{request.span_id}-01"
    assert access[0]["trace_id"] == CLIENT_TRACE


def test_a_request_without_a_traceparent_starts_a_trace(otlp: Receiver) -> None:
    with gunicorn_server(probe_env(otlp)) as server:
        answer = requests.post(server.url + "/predict", json={"text": "hi"}, timeout=10)
        assert answer.status_code == 200, answer.text
        trace_id = answer.headers["traceresponse"].split("-")[1]
        spans = otlp.wait_for(
            lambda spans: [s for s in spans if s.trace_id == trace_id and s.name == "model"],
            "the new trace's model span",
        )
        request = otlp.wait_for(
            lambda spans: [s for s in spans if s.name == "POST /predict"], "the request's span"
        )[0]
    assert request.parent_id == ""
    assert spans[0].parent_id == request.span_id


def test_requests_that_share_a_batch_have_one_model_span_linked_to_each(
    otlp: Receiver, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    env = probe_env(
        otlp, SERVING_MAX_BATCH_SIZE="16", SERVING_MAX_QUEUE="32", SERVING_REQUEST_TIMEOUT_S="60"
    )
    with gunicorn_server(env) as server:
        url = server.url + "/predict"
        # The model thread holds a first batch until the gate opens, so the 16 queue.
        holder = threading.Thread(
            target=requests.post, args=(url,), kwargs={"json": {"gate": str(gate)}, "timeout": 60}
        )
        holder.start()
        wait_for((gate / "started").exists, "the first batch to start")
        answers: list[requests.Response] = []

        def send(i: int) -> None:
            answers.append(requests.post(url, json={"text": str(i)}, timeout=60))

        senders = [threading.Thread(target=send, args=(i,)) for i in range(16)]
        for sender in senders:
            sender.start()
        wait_for(
            lambda: requests.get(server.url + "/metrics", timeout=5).text.count(
                "serving_queue_depth 16.0"
            ),
            "16 requests queued",
        )
        (gate / "open").touch()
        for thread in (holder, *senders):
            thread.join(60)
        assert [a.status_code for a in answers] == [200] * 16
        assert {a.json()["batch_size"] for a in answers} == {16}
        ids = {a.headers["traceresponse"].split("-")[1] for a in answers}
        models = otlp.wait_for(
            lambda spans: [
                s for s in spans if s.name == "model" and s.attributes["serving.batch_size"] == 16
            ],
            "the batch of 16's model span",
        )
        servers = otlp.wait_for(
            lambda spans: (
                (
                    found := {
                        s.trace_id: s for s in spans if s.trace_id in ids and s.kind == "server"
                    }
                )
                and len(found) == 16
                and found
            ),
            "the 16 requests' spans",
        )
    (model,) = models
    assert sorted(model.links) == sorted((t, s.span_id) for t, s in servers.items())
    # Its parent is one of them; each of the others links to it from its queue span.
    assert model.trace_id in ids
    queues = [s for s in otlp.spans() if s.name == "queue" and s.trace_id in ids]
    assert len(queues) == 16
    assert {q.links for q in queues} == {((model.trace_id, model.span_id),)}


def test_a_failed_batch_is_an_error_and_its_log_line_names_the_trace(otlp: Receiver) -> None:
    with gunicorn_server(probe_env(otlp)) as server:
        answer = requests.post(
            server.url + "/predict",
            json={"fail": True},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=10,
        )
        assert answer.status_code == 500, answer.text
        spans = otlp.wait_for(
            lambda spans: len([s for s in spans if s.trace_id == CLIENT_TRACE]) >= 2 and spans,
            "the failed request's spans",
        )
        logged = wait_for(
            lambda: [
                json.loads(line)
                for line in server.output().splitlines()
                if line.startswith("{") and "the handler failed" in line
            ],
            "the handler's failure in the log",
        )
    trace = {s.name: s for s in spans if s.trace_id == CLIENT_TRACE}
    assert trace["POST /predict"].status == 2  # ERROR: a 500 is the server's
    assert trace["POST /predict"].attributes["http.response.status_code"] == 500
    assert logged[0]["trace_id"] == CLIENT_TRACE
    assert logged[0]["span_id"] == trace["model"].span_id


def test_a_refused_request_is_the_clients_error_not_the_servers(otlp: Receiver) -> None:
    with gunicorn_server(probe_env(otlp)) as server:
        answer = requests.post(
            server.url + "/predict",
            json={"text": 3},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=10,
        )
        assert answer.status_code == 400, answer.text
        (request,) = otlp.wait_for(
            lambda spans: [s for s in spans if s.name == "POST /predict"], "the request's span"
        )
    assert request.status == 0  # unset: a 4xx is not the server's error
    assert request.attributes["http.response.status_code"] == 400


def test_the_rows_of_a_v2_request_are_under_its_span_and_linked_from_their_batch(
    otlp: Receiver,
) -> None:
    with gunicorn_server(probe_env(otlp)) as server:
        body = {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": ["a", "b", "c"]}]
        }
        answer = requests.post(
            server.url + "/v2/models/probe/infer",
            json=body,
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        spans = otlp.wait_for(
            lambda spans: (
                [s for s in spans if s.trace_id == CLIENT_TRACE and s.kind == "server"]
                and len([s for s in spans if s.trace_id == CLIENT_TRACE and s.name == "queue"]) == 3
                and [s for s in spans if s.trace_id == CLIENT_TRACE]
            ),
            "the three rows' queue spans",
        )
        probes = [s for s in otlp.spans() if "readyz" in s.name]
    (request,) = [s for s in spans if s.kind == "server"]
    assert request.name == "POST /v2/models/<name>/infer"
    assert probes == []  # the probes are not traced
    assert request.trace_id == CLIENT_TRACE
    queues = [s for s in spans if s.name == "queue"]
    assert {(q.trace_id, q.parent_id) for q in queues} == {(CLIENT_TRACE, request.span_id)}
    models = {s.span_id: s for s in otlp.spans() if s.name == "model" and s.links}
    # Each row's batch links to the request, once however many of its rows it ran.
    assert all(len(m.links) == 1 for m in models.values())
    assert sum(m.attributes["serving.batch_size"] for m in models.values()) == 3
    assert {link for m in models.values() for link in m.links} == {(CLIENT_TRACE, request.span_id)}
    assert {q.links[0][1] for q in queues} <= set(models)
