"""The brokers tests/stream's end-to-end tests run over: one ``broker`` fixture, a param each."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Protocol

import pytest

from tests.rabbitmq_server import RabbitMQServer, rabbitmq_server
from tests.s3_server import moto_s3
from tests.stream.amqp_broker import AmqpBroker
from tests.stream.kafka_broker import KafkaBroker
from tests.stream.redis_broker import Item, RedisBroker


class Broker(Protocol):
    """What each broker's test class has (the spec's): a context manager that runs it."""

    source_url: str
    sink_url: str
    dead_url: str
    # Whether the broker counts a message's deliveries (Kafka keeps no count).
    counts_deliveries: bool
    # Whether its client reconnects by itself (librdkafka), so that a consumer that lost
    # the broker does not open its ends again (serving_stream_reconnects_total).
    client_reconnects: bool

    def __enter__(self) -> Broker: ...
    def __exit__(self, *exc: object) -> None: ...
    def produce(self, items: list[Item], *, one_batch: bool = False) -> None:
        """``one_batch``: where the broker splits a source (Kafka's partitions), keep
        them together, so that one consumer's take can hold them all."""
        ...

    def results(self) -> list[Item]: ...
    def dead(self) -> list[Item]: ...
    def lag(self) -> int: ...
    def restart(self) -> None: ...


def _amqp(request: pytest.FixtureRequest) -> contextlib.AbstractContextManager[Broker]:
    # One node for the session (it takes ~10 s to start), each test its own queues.
    server: RabbitMQServer = request.getfixturevalue("rabbitmq")
    return AmqpBroker(server, prefix=f"t{uuid.uuid4().hex[:8]}-")


def _kafka(request: pytest.FixtureRequest) -> contextlib.AbstractContextManager[Broker]:
    # One S3 server for the session; each test its own broker, bucket and topics.
    s3: str = request.getfixturevalue("s3")
    return KafkaBroker(s3)


# A broker more is one entry more (its class in tests/stream/BROKER_broker.py).
BROKERS: dict[str, Callable[[pytest.FixtureRequest], contextlib.AbstractContextManager[Broker]]] = {
    "redis": lambda request: RedisBroker(),
    "amqp": _amqp,
    "kafka": _kafka,
}


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[RabbitMQServer]:
    with rabbitmq_server() as running:
        yield running


@pytest.fixture(scope="session")
def s3() -> Iterator[str]:
    with moto_s3() as running:
        yield running.endpoint


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.e2e) for name in BROKERS])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    with BROKERS[request.param](request) as running:
        yield running
