"""Traces of ``serving-core stream``: a real worker over a real Redis and RabbitMQ, and a
real OTLP receiver.

A message published with a ``traceparent`` header is one trace with its
consumer's work: ``message doubler`` (consumer, its parent the producer's span)
→ ``model`` (linked to it) and ``publish`` (producer), whose ``traceparent``
the result carries, so a reader of the sink continues the same trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving_core.tracing import traceparent
from tests.otlp_receiver import Received, Receiver, tracing_env
from tests.servers import wait_for
from tests.stream.amqp_broker import AmqpBroker
from tests.stream.conftest import Broker
from tests.stream.redis_broker import RedisBroker
from tests.stream.test_stream_worker import stream_worker

PRODUCER_TRACE = "5b8efff798038103d269b633813fc60c"
PRODUCER_SPAN = "eee19b7ec3c1b174"
DEAD_TRACE = "6e0c63257de34c926f9efcd03899b87d"
SYSTEMS = {"redis": "redis", "amqp": "rabbitmq"}


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.e2e) for name in SYSTEMS])
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[str, Broker]]:
    running: contextlib.AbstractContextManager[Broker]
    running = RedisBroker() if request.param == "redis" else AmqpBroker()
    with running as ends:
        yield SYSTEMS[request.param], ends


def _one(spans: list[Received], name: str, trace_id: str) -> Received:
    found = [s for s in spans if s.name == name and s.trace_id == trace_id]
    assert len(found) == 1, (name, trace_id, [(s.name, s.trace_id[:8]) for s in spans])
    return found[0]


def test_a_message_continues_its_producers_trace_and_its_result_carries_it(
    broker: tuple[str, Broker], otlp: Receiver, tmp_path: Path
) -> None:
    system, ends = broker
    produced = f"00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"
    ends.produce(
        [
            ("traced", b'{"n": 1}', {"traceparent": produced, "tenant": "a"}),
            ("untraced", b'{"n": 2}', {}),
            ("broken", b"not json", {"traceparent": f"00-{DEAD_TRACE}-{PRODUCER_SPAN}-01"}),
        ],
        one_batch=True,
    )
    with stream_worker(ends, tmp_path, **tracing_env(otlp)):
        results = wait_for(lambda: len(got := ends.results()) >= 2 and got, "both results")
        dead = wait_for(ends.dead, "the dead letter")
        spans = otlp.wait_for(
            lambda spans: len([s for s in spans if s.name == "publish"]) >= 3 and spans,
            "three publish spans",
        )
    by_id = {message_id: headers for message_id, _, headers in results}
    message = _one(spans, "message doubler", PRODUCER_TRACE)
    assert (message.kind, message.parent_id) == ("consumer", PRODUCER_SPAN)
    assert message.attributes["messaging.system"] == system
    assert message.attributes["messaging.message.id"] == "traced"
    assert message.attributes["serving.deliveries"] == 1
    assert message.resource["serving.model.name"] == "doubler"
    # The result's traceparent is its publish span, a child of the message's.
    publish = _one(spans, "publish", PRODUCER_TRACE)
    assert (publish.kind, publish.parent_id) == ("producer", message.span_id)
    assert by_id["traced"]["traceparent"] == f"00-{PRODUCER_TRACE}-{publish.span_id}-01"
    assert by_id["traced"]["tenant"] == "a"  # the other headers travel as before
    untraced_trace = traceparent.trace_id_of(by_id["untraced"]["traceparent"])
    assert untraced_trace not in (None, PRODUCER_TRACE, DEAD_TRACE)
    unheaded = _one(spans, "message doubler", str(untraced_trace))
    assert unheaded.parent_id == ""  # no traceparent: a trace of its own
    # The batch (or batches: a take may hold one message) links to each message's span.
    linked = {link for s in spans if s.name == "model" for link in s.links}
    assert linked == {(PRODUCER_TRACE, message.span_id), (str(untraced_trace), unheaded.span_id)}
    # A dead letter carries its message's trace on too, and its span says why.
    [(_, _, dead_headers)] = dead
    assert traceparent.trace_id_of(dead_headers["traceparent"]) == DEAD_TRACE
    assert dead_headers["error"] == "invalid_json"
    broken = _one(spans, "message doubler", DEAD_TRACE)
    assert broken.attributes["error.type"] == "invalid_json"
