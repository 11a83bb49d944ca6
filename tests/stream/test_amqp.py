"""The RabbitMQ source and sink against a real rabbitmq-server (tests/rabbitmq_server.py).

One node serves tests/stream (it takes seconds to start; conftest.py's ``rabbitmq``);
each test has queues of its own. The broker-restart test runs a node of its own.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pika
import pika.exceptions
import pytest

from serving_core.stream.amqp import AmqpSink, AmqpSource
from serving_core.stream.base import BrokerError, Message, Outgoing
from tests.rabbitmq_server import RabbitMQServer
from tests.servers import free_port, wait_for
from tests.stream.amqp_broker import AmqpBroker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


@pytest.fixture
def server(rabbitmq: RabbitMQServer) -> RabbitMQServer:
    """tests/stream's one node for the session (conftest.py), which the worker's tests
    of the amqp broker use too: each test here declares queues of its own."""
    return rabbitmq


@pytest.fixture
def broker(server: RabbitMQServer) -> Iterator[AmqpBroker]:
    with AmqpBroker(server, prefix=f"t{uuid.uuid4().hex[:8]}-") as running:
        yield running


def items(n: int, start: int = 0) -> list[tuple[str, bytes, dict[str, str]]]:
    return [
        (f"m{i}", json.dumps({"i": i}).encode(), {"n": str(i), "trace": f"t{i}"})
        for i in range(start, start + n)
    ]


def take_all(source: AmqpSource, n: int, batch: int) -> list[Message]:
    taken: list[Message] = []

    def enough() -> bool:
        taken.extend(source.take(batch, 1.0))
        return len(taken) >= n

    wait_for(enough, f"{n} messages")
    return taken


def test_5000_messages_taken_in_batches_published_with_confirms_and_acked_arrive_once_each(
    broker: AmqpBroker,
) -> None:
    sent = items(5000)
    broker.produce(sent)
    source = AmqpSource(broker.source_url, batch_size=64, consumer="test")
    sink = AmqpSink(broker.sink_url)
    sizes = []
    try:
        done = 0
        while done < len(sent):
            batch = source.take(64, 5.0)
            assert batch, f"the queue ran dry after {done} of {len(sent)}"
            assert len(batch) <= 64
            sizes.append(len(batch))
            sink.publish([Outgoing(m.id, m.body, m.headers) for m in batch])
            source.ack(batch)
            done += len(batch)
        assert source.take(64, 0.2) == []
    finally:
        sink.close()
        source.close()
    results = broker.results()
    assert Counter(id_ for id_, _, _ in results) == Counter(id_ for id_, _, _ in sent)
    assert sorted(results) == sorted(sent)  # bodies and headers travelled with their ids
    assert max(sizes) == 64  # prefetch lets a whole batch be taken at once
    assert broker.lag() == 0  # nothing was left unacked: the source closed, none came back


def test_a_result_is_persistent_json_under_its_inputs_id(broker: AmqpBroker) -> None:
    sink = AmqpSink(broker.sink_url)
    sink.publish([Outgoing("abc", b'{"y": 1}', {"k": "v"})])
    sink.close()
    connection = pika.BlockingConnection(pika.URLParameters(broker.server.url))
    method, properties, body = connection.channel().basic_get(broker.results_queue, auto_ack=True)
    connection.close()
    assert method is not None
    assert properties is not None
    assert body == b'{"y": 1}'
    assert properties.message_id == properties.correlation_id == "abc"
    assert properties.delivery_mode == 2
    assert properties.content_type == "application/json"
    # A quorum queue adds its delivery count (0: the first delivery).
    assert properties.headers == {"k": "v", "x-delivery-count": 0}


def test_messages_taken_but_not_acked_come_back_once_the_source_closes(
    broker: AmqpBroker,
) -> None:
    broker.produce(items(10))
    first = AmqpSource(broker.source_url, batch_size=5, consumer="first")
    taken = take_all(first, 10, 10)
    assert {m.deliveries for m in taken} == {1}
    by_id = {m.id: m for m in taken}
    # Acked out of order, and not from the oldest: one multiple ack would not do.
    first.ack([by_id["m3"], by_id["m1"]])
    first.ack([by_id["m0"], by_id["m2"], by_id["m7"]])
    first.close()

    second = AmqpSource(broker.source_url, batch_size=5, consumer="second")
    again = take_all(second, 5, 10)
    second.ack(again)
    assert second.take(10, 0.2) == []
    second.close()
    assert sorted(m.id for m in again) == ["m4", "m5", "m6", "m8", "m9"]
    assert {m.deliveries for m in again} == {2}
    assert broker.lag() == 0


def test_a_message_from_before_a_reconnect_is_not_acked_on_the_new_channel(
    broker: AmqpBroker,
) -> None:
    broker.produce(items(2))
    old = AmqpSource(broker.source_url, batch_size=1, consumer="old")
    stale = take_all(old, 1, 1)
    old.close()
    new = AmqpSource(broker.source_url, batch_size=1, consumer="new")
    fresh = take_all(new, 1, 1)
    # Delivery tag 1 on both channels: acking the stale one must not ack the fresh one.
    new.ack(stale)
    new.close()
    assert fresh
    assert broker.lag() == 2  # neither was acked: both are back in the queue


def test_lag_is_the_queues_depth_of_messages_not_handed_out(broker: AmqpBroker) -> None:
    broker.produce(items(7))
    source = AmqpSource(broker.source_url, batch_size=1, consumer="lag")
    try:
        taken = take_all(source, 1, 1)
        # Prefetch 3 batches of 1: three are out (one taken, two on their way), four wait.
        assert wait_for(lambda: source.lag() == 4, "lag 4")
        assert broker.lag() == 4
        source.ack(taken)
        assert wait_for(lambda: source.lag() == 3, "lag 3 after an ack")
    finally:
        source.close()


def test_a_source_whose_queue_is_deleted_raises_instead_of_waiting(broker: AmqpBroker) -> None:
    source = AmqpSource(broker.source_url, batch_size=1, consumer="deleted")
    try:
        connection = pika.BlockingConnection(pika.URLParameters(broker.server.url))
        connection.channel().queue_delete(broker.queue)
        connection.close()
        with pytest.raises(BrokerError, match="cancelled the consumer"):
            source.take(1, 30.0)
    finally:
        source.close()


def test_a_message_without_a_message_id_is_handed_out_with_an_empty_id(
    broker: AmqpBroker,
) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(broker.server.url))
    channel = connection.channel()
    channel.confirm_delivery()
    headers: dict[str, Any] = {"n": 7, "flag": True, "raw": b"bytes"}
    channel.basic_publish(
        "", broker.queue, b'{"x": 1}', pika.BasicProperties(headers=headers), mandatory=True
    )
    connection.close()
    source = AmqpSource(broker.source_url, batch_size=4, consumer="noid")
    [message] = take_all(source, 1, 4)
    source.close()
    # The consumer dead-letters it: its result could not be matched to its input.
    assert message.id == ""
    assert message.body == b'{"x": 1}'
    assert message.headers == {"n": "7", "flag": "True", "raw": "bytes"}
    assert message.deliveries == 1


def test_the_source_declares_its_queue_as_a_durable_quorum_queue(broker: AmqpBroker) -> None:
    name = f"{broker.queue}-own"
    source = AmqpSource(f"{broker.server.url}?queue={name}", batch_size=1, consumer="q")
    source.close()
    connection = pika.BlockingConnection(pika.URLParameters(broker.server.url))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="x-queue-type"):
        connection.channel().queue_declare(name, durable=True)  # a classic one: refused
    connection.close()


def test_a_queue_of_another_type_is_a_broker_error_that_names_it(server: RabbitMQServer) -> None:
    name = f"classic-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    connection.channel().queue_declare(name, durable=True)
    connection.close()
    with pytest.raises(BrokerError, match=f"cannot consume from queue '{name}'.*x-queue-type"):
        AmqpSource(f"{server.url}?queue={name}", batch_size=1, consumer="c")


@pytest.mark.parametrize("exchange", ["", "nowhere"])
def test_an_unroutable_result_is_a_broker_error(broker: AmqpBroker, exchange: str) -> None:
    sink = AmqpSink(f"{broker.server.url}?exchange={exchange}&routing_key=no-such-queue")
    try:
        with pytest.raises(BrokerError, match=r"unroutable.*'lost'"):
            sink.publish([Outgoing("lost", b"{}")])
        sink.publish([])  # nothing to publish: nothing asked of the broker
    finally:
        sink.close()


def test_a_broker_restart_fails_open_sources_and_sinks_and_loses_nothing_durable() -> None:
    with AmqpBroker() as broker:
        broker.produce(items(100))
        source = AmqpSource(broker.source_url, batch_size=10, consumer="before")
        sink = AmqpSink(broker.sink_url)
        batch = source.take(10, 5.0)
        assert batch
        sink.publish([Outgoing(m.id, m.body, m.headers) for m in batch])
        source.ack(batch)
        unacked = take_all(source, 10, 10)

        broker.restart()
        with pytest.raises(BrokerError):
            source.take(10, 1.0)
        with pytest.raises(BrokerError):
            source.ack(unacked)
        with pytest.raises(BrokerError):
            sink.publish([Outgoing("after", b"{}")])
        source.close()
        sink.close()

        # What was acked is gone; the rest, the unacked included, is there again.
        assert broker.lag() == 100 - len(batch)
        assert sorted(broker.results()) == sorted((m.id, m.body, m.headers) for m in batch)
        source = AmqpSource(broker.source_url, batch_size=10, consumer="after")
        sink = AmqpSink(broker.sink_url)
        rest: list[Message] = []
        while len(rest) < 100 - len(batch):
            # Prefetch holds back the rest until these are acked.
            taken = take_all(source, 1, 10)
            sink.publish([Outgoing(m.id, m.body, m.headers) for m in taken])
            source.ack(taken)
            rest += taken
        # Those the first source held (taken, or prefetched) come a second time.
        assert {m.id for m in unacked} <= {m.id for m in rest if m.deliveries == 2}
        assert {m.deliveries for m in rest} <= {1, 2}
        source.close()
        sink.close()
        assert sorted(broker.results()) == sorted(items(100))
        assert broker.lag() == 0
        groups = broker.server.process_groups()
    assert len(groups) == 2
    for group in groups:  # the node (script, VM, helpers) and its epmd: all stopped
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)


def test_a_broker_that_is_not_there_is_a_broker_error() -> None:
    url = f"amqp://guest:secret@127.0.0.1:{free_port()}/%2F"
    with pytest.raises(BrokerError, match="cannot connect") as failed:
        AmqpSource(f"{url}?queue=q", batch_size=1, consumer="c")
    assert "secret" not in str(failed.value)
    with pytest.raises(BrokerError, match="cannot connect"):
        AmqpSink(f"{url}?routing_key=q")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "redis://h:6379/0?queue=q",
            "an AMQP source is amqp://USER:PASS@HOST:PORT/VHOST?queue=NAME",
        ),
        ("amqp:///%2F?queue=q", "an AMQP source is amqp://"),
        ("amqp://h/%2F", "an AMQP source needs queue=NAME"),
        ("amqp://h/%2F?queue=", "an AMQP source needs queue=NAME"),
        ("amqp://h/%2F?queue=a&queue=b", "queue= is given twice"),
        ("amqp://h/%2F?queue=q&nope=1", "Unknown URL parameter: 'nope'"),
        ("amqp://h/%2F?queue=q&heartbeat=soon", "Invalid heartbeat value"),
    ],
)
def test_a_bad_source_url_says_what_an_amqp_source_takes(url: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)) as failed:
        AmqpSource(url, batch_size=1, consumer="c")
    assert str(failed.value).startswith(f"'{url}': ")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("amqp://u:hunter2@h/%2F?exchange=x", "an AMQP sink needs routing_key=NAME"),
        ("amqp://u:hunter2@h/%2F?exchange=x&routing_key=", "needs routing_key=NAME"),
        ("amqps://u:hunter2@h/%2F?queue=q&routing_key=r", "Unknown URL parameter: 'queue'"),
    ],
)
def test_a_bad_sink_url_says_what_an_amqp_sink_takes_and_hides_the_password(
    url: str, said: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(said)) as failed:
        AmqpSink(url)
    assert "hunter2" not in str(failed.value)
    assert "u:***@h" in str(failed.value)


@pytest.mark.parametrize("forged", ["abc", Decimal("2.5"), 99, b"7", {"n": 1}])
def test_l3_a_producers_x_delivery_count_neither_crashes_the_source_nor_counts(
    broker: AmqpBroker, forged: Any
) -> None:
    """L3: a producer's x-delivery-count that is not a number crashed the consumer (int()
    in the delivery callback), and a forged one dead-lettered its message unrun. Only
    a redelivery's count is the broker's."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.server.url))
    channel = connection.channel()
    channel.confirm_delivery()
    properties = pika.BasicProperties(message_id="m", headers={"x-delivery-count": forged})
    channel.basic_publish("", broker.queue, b'{"x": 1}', properties, mandatory=True)
    connection.close()
    source = AmqpSource(broker.source_url, batch_size=4, consumer="l3")
    [message] = take_all(source, 1, 4)
    assert (message.deliveries, message.headers) == (1, {})
    source.close()  # unacked: handed out again, now with the broker's own count
    again = AmqpSource(broker.source_url, batch_size=4, consumer="l3-again")
    [message] = take_all(again, 1, 4)
    again.ack([message])
    again.close()
    assert (message.deliveries, message.headers) == (2, {})
