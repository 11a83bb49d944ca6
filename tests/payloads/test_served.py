"""Payload logging in a served app, with real sinks: gunicorn's gevent workers logging to
a real redis-server (the sampled ids exactly, redacted, every error; then the server
killed mid-run, which costs no request an error and is counted on /metrics), V2 rows
logged to a real rabbitmq-server, and a traced request's event under its span."""

from __future__ import annotations

import os
import re
import signal
import socket

import orjson
import pytest
import redis
import requests

from serving_core.payloads.sampler import fraction
from tests.conftest import HANDLERS, make_app
from tests.otlp_receiver import Receiver, tracing_env
from tests.payloads.test_httpsink import receiver
from tests.redis_server import redis_server
from tests.servers import gunicorn_server, wait_for
from tests.stream.amqp_broker import AmqpBroker

pytestmark = pytest.mark.e2e
HANDLER = str(HANDLERS / "payloads" / "handler.py")
RATE = 0.3
REDACTED = "[redacted]"
_COUNT = re.compile(r'^serving_payload_events_total\{outcome="(\w+)"\} ([0-9.e+]+)$', re.M)


def logged(redis_url: str) -> list[dict]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [orjson.loads(fields[b"body"]) for _, fields in client.xrange("payloads")]
    finally:
        client.close()


def counted(url: str) -> dict[str, float]:
    """serving_payload_events_total by outcome, summed over the workers."""
    text = requests.get(url + "/metrics", timeout=10).text
    return {outcome: float(value) for outcome, value in _COUNT.findall(text)}


def predict(url: str, request_id: str, body: dict) -> requests.Response:
    return requests.post(
        url + "/predict", json=body, headers={"X-Request-ID": request_id}, timeout=10
    )


def test_the_sampled_ids_land_in_redis_redacted_with_every_error():
    with redis_server() as redis_url:
        env = {
            "SERVING_HANDLER": HANDLER,
            "SERVING_WORKERS": "2",
            "SERVING_PAYLOAD_LOG_URL": redis_url + "?stream=payloads",
            "SERVING_PAYLOAD_LOG_RATE": str(RATE),
            "SERVING_PAYLOAD_LOG_REDACT": "email",
            "SERVING_MODEL_REVISION": "build7",
        }
        with gunicorn_server(env) as server:
            ids = [f"req-{n}" for n in range(80)]
            for request_id in ids:
                body = {
                    "text": request_id,
                    "email": "ann@example.com",  # the setting's
                    "ssn": "078-05-1120",  # the handler's
                    "profile": {"Password": "pw", "city": "Oslo"},  # a default, nested
                }
                assert predict(server.url, request_id, body).status_code == 200
            errors = [f"bad-{n}" for n in range(5)]
            for request_id in errors:
                assert (
                    predict(server.url, request_id, {"text": "x", "bad": True}).status_code == 400
                )
            # A V2 request: each row is an exchange of its own, sampled as such; the first
            # row has the request's id, the others the id and their index ("ID.N").
            rows = {
                "inputs": [
                    {"name": "text", "datatype": "BYTES", "shape": [4], "data": list("abcd")}
                ]
            }
            answer = requests.post(
                server.url + "/v2/models/payloads/infer",
                json=rows,
                headers={"X-Request-ID": "v2"},
                timeout=10,
            )
            assert answer.status_code == 200, answer.text

            sampled = {request_id for request_id in ids if fraction(request_id) < RATE}
            assert 0 < len(sampled) < len(ids)
            v2_ids = ["v2", "v2.1", "v2.2", "v2.3"]
            v2_rows = {request_id for request_id in v2_ids if fraction(request_id) < RATE}
            assert v2_rows
            total = len(sampled) + len(errors) + len(v2_rows)
            events = wait_for(
                lambda: (found := logged(redis_url)) and len(found) >= total and found,
                "the events in the stream",
            )
            wait_for(lambda: counted(server.url).get("sent") == total, "the events counted")
            counts = counted(server.url)

    assert len(events) == total
    assert counts == {"sent": total, "dropped": 0, "failed": 0}
    by_id: dict[str, list[dict]] = {}
    for event in events:
        by_id.setdefault(event["requestid"], []).append(event)
    assert set(by_id) == sampled | set(errors) | v2_rows
    assert len({event["id"] for event in events}) == total  # an id per event
    for event in events:
        assert event["specversion"] == "1.0"
        assert event["source"] == "serving-core/payloads"
        assert event["type"] == "io.serving-core.inference"
        assert (event["modelname"], event["modelversion"]) == ("payloads", "3")
        assert event["modelrevision"] == "build7"
    for request_id in sampled:
        [event] = by_id[request_id]
        assert event["data"] == {
            "request": {
                "text": request_id,
                "email": REDACTED,
                "ssn": REDACTED,
                "profile": {"Password": REDACTED, "city": "Oslo"},
            },
            "response": {"echo": request_id, "token": REDACTED},
        }
    for request_id in errors:
        [event] = by_id[request_id]
        assert event["data"]["error"] == {"status": 400, "message": "refused on purpose"}
        assert "response" not in event["data"]
    for request_id in v2_rows:
        [event] = by_id[request_id]
        row = "abcd"[v2_ids.index(request_id)]
        assert event["data"]["request"] == {"text": row}


def test_a_sink_killed_mid_run_costs_no_request_an_error_and_is_counted():
    with redis_server() as redis_url:
        client = redis.Redis.from_url(redis_url)
        redis_pid, port = (
            int(client.info()["process_id"]),
            client.connection_pool.connection_kwargs["port"],
        )
        client.close()
        env = {
            "SERVING_HANDLER": HANDLER,
            "SERVING_WORKERS": "1",
            "SERVING_PAYLOAD_LOG_URL": redis_url + "?stream=payloads",
            "SERVING_PAYLOAD_LOG_QUEUE": "2",
        }
        with gunicorn_server(env) as server:
            for n in range(10):  # one at a time: a queue of two holds each
                assert predict(server.url, f"before-{n}", {"text": "x"}).status_code == 200
                wait_for(lambda n=n: counted(server.url).get("sent") == n + 1, f"event {n} sent")
            assert len(logged(redis_url)) == 10

            os.kill(redis_pid, signal.SIGKILL)
            wait_for(lambda: not _listening(port), "redis-server gone")
            statuses = [
                predict(server.url, f"after-{n}", {"text": "x"}).status_code for n in range(40)
            ]
            assert statuses == [200] * 40
            # Every event after the kill ends failed (its send failed) or dropped (the
            # queue of two was full): none is lost uncounted, none is sent.
            wait_for(
                lambda: (c := counted(server.url))["failed"] + c["dropped"] == 40,
                lambda: f"the 40 events counted, so far {counted(server.url)}",
                timeout_s=60,
            )
            counts = counted(server.url)
            assert counts["sent"] == 10
            assert counts["failed"] >= 1
            assert "hunter" not in server.output()
            assert "payload log: redis://127.0.0.1" in server.output()


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
    except OSError:
        return False
    return True


def test_v2_rows_land_in_a_rabbitmq_exchange_as_cloudevents():
    with AmqpBroker() as broker:
        app = make_app(HANDLER, payload_log_url=broker.sink_url, max_wait_ms=1)
        service = app.extensions["serving_core"]
        service.start()
        try:
            rows = {
                "inputs": [
                    {"name": "text", "datatype": "BYTES", "shape": [3], "data": ["a", "b", "c"]}
                ]
            }
            answer = app.test_client().post(
                "/v2/models/payloads/infer", json=rows, headers={"X-Request-ID": "v2-rows"}
            )
            assert answer.status_code == 200, answer.get_data()
            refused = app.test_client().post(
                "/predict", json={"bad": True, "token": "t"}, headers={"X-Request-ID": "no"}
            )
            assert refused.status_code == 400
        finally:
            service.stop()  # sends what is queued
        results = wait_for(
            lambda: (found := broker.results()) and len(found) >= 4 and found, "4 events"
        )
    assert len(results) == 4
    events = [orjson.loads(body) for _, body, _ in results]
    assert all(
        headers["content-type"] == "application/cloudevents+json" for _, _, headers in results
    )
    assert [message_id for message_id, _, _ in results] == [event["id"] for event in events]
    answers = [event for event in events if event["requestid"].startswith("v2-rows")]
    assert sorted(event["requestid"] for event in answers) == ["v2-rows", "v2-rows.1", "v2-rows.2"]
    assert sorted(event["data"]["response"]["echo"] for event in answers) == ["a", "b", "c"]
    [error] = [event for event in events if event["requestid"] == "no"]
    assert error["data"] == {
        "request": {"bad": True, "token": REDACTED},
        "error": {"status": 400, "message": "refused on purpose"},
    }


CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_traced_requests_event_carries_its_server_spans_traceparent(otlp: Receiver):
    with receiver() as sink:
        env = tracing_env(
            otlp,
            SERVING_HANDLER=HANDLER,
            SERVING_WORKERS="1",
            SERVING_PAYLOAD_LOG_URL=sink.url + "/events",
        )
        with gunicorn_server(env) as server:
            rows = {
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]
            }
            answer = requests.post(
                server.url + "/v2/models/payloads/infer",
                json=rows,
                headers={"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"},
                timeout=10,
            )
            assert answer.status_code == 200, answer.text
            posts = wait_for(lambda: len(sink.posts) >= 2 and list(sink.posts), "both rows' events")
            spans = otlp.wait_for(
                lambda spans: [s for s in spans if s.kind == "server"], "the server span"
            )
    [request] = [span for span in spans if span.trace_id == CLIENT_TRACE and span.kind == "server"]
    for _, _, body in posts:
        assert orjson.loads(body)["traceparent"] == f"00-{CLIENT_TRACE}-{request.span_id}-01"
