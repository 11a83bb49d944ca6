"""A RabbitMQ consumer whose batch outlasts its connections' heartbeat timeout, against
the real rabbitmq-server of tests/stream (conftest.py's ``rabbitmq``)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from serving_core import Handler
from serving_core.engine.engine import Engine
from serving_core.loops.inflight import Ends
from serving_core.loops.stream import StreamLoop
from serving_core.metrics.stream import StreamMetrics
from serving_core.stream.amqp import AmqpSink, AmqpSource
from tests.rabbitmq_server import RabbitMQServer
from tests.stream.amqp_broker import AmqpBroker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture
def broker(rabbitmq: RabbitMQServer) -> Iterator[AmqpBroker]:
    with AmqpBroker(rabbitmq, prefix=f"t{uuid.uuid4().hex[:8]}-") as running:
        yield running


HEARTBEAT = "&heartbeat=1"  # on each end's URL: RabbitMQ drops one silent for ~2 s
SLOW_BATCH_S = 4.0
IDLE_S = 4.0


class Sleeper(Handler):
    """Answers each item with its ``i`` after ``sleep_s`` a batch."""

    name = "sleeper"

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def predict_batch(self, items: list[Any]) -> list[Any]:
        time.sleep(self.sleep_s)
        return [{"i": item["i"]} for item in items]


def consume(broker: AmqpBroker, handler: Handler, before: Callable[[], None]) -> int:
    """A consumer over ``broker``'s queues on 1 s heartbeats, ``before`` called at each
    turn, until the result is out and nothing waits in the queue (the stop then acks the
    batch in hand), or its ends were opened again (a connection was lost): how many
    times they were opened."""
    kept = Ends(
        AmqpSource(broker.source_url + HEARTBEAT, batch_size=8, consumer="kept"),
        AmqpSink(broker.sink_url + HEARTBEAT),
        AmqpSink(broker.dead_url + HEARTBEAT),
    )
    opened: list[Ends] = []

    def ends() -> Ends:
        opened.append(kept)
        return kept

    def stopping() -> bool:
        before()
        return len(opened) > 1 or (bool(broker.results()) and broker.lag() == 0)

    try:
        StreamLoop(
            Engine(handler, max_batch_size=8),
            ends,
            max_batch_size=8,
            max_attempts=3,
            stopping=stopping,
            metrics=StreamMetrics(),
        ).run()
    finally:
        kept.close()
    return len(opened)


def test_a_batch_longer_than_the_heartbeat_timeout_keeps_its_connections(
    broker: AmqpBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """pika sends heartbeats only when called: a batch running 4 s on connections whose
    heartbeat is 1 s lost them (RabbitMQ closes one silent for two heartbeats), and its
    message came back and ran again, for ever with a slow enough model. The consumer's
    thread keeps them alive while the model thread runs."""
    broker.produce([("m0", json.dumps({"i": 0}).encode(), {})])
    caplog.set_level(logging.WARNING, "serving_core.loops.stream")
    opened = consume(broker, Sleeper(SLOW_BATCH_S), lambda: None)
    assert "lost the broker" not in caplog.text
    assert opened == 1
    assert [(m_id, json.loads(body)) for m_id, body, _ in broker.results()] == [("m0", {"i": 0})]


def test_a_consumer_idle_longer_than_the_heartbeat_timeout_keeps_its_sinks(
    broker: AmqpBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle consumer's takes keep its source's connection alive, but its sinks see no
    call until the next batch's results: idle for 4 s on 1 s heartbeats, the sink's
    connection was gone, and the first message after the pause was handed out again."""
    started, produced = time.monotonic(), []

    def after_a_pause() -> None:
        if not produced and time.monotonic() - started > IDLE_S:
            broker.produce([("m0", json.dumps({"i": 0}).encode(), {})])
            produced.append(True)

    caplog.set_level(logging.WARNING, "serving_core.loops.stream")
    opened = consume(broker, Sleeper(0.0), after_a_pause)
    assert "lost the broker" not in caplog.text
    assert opened == 1
    assert [(m_id, json.loads(body)) for m_id, body, _ in broker.results()] == [("m0", {"i": 0})]
