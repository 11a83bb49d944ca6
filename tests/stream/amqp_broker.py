"""A real RabbitMQ for the stream tests: a quorum queue in, an exchange and a bound
queue for results, another for dead letters (the shape of tests/stream's brokers)."""

from __future__ import annotations

from types import TracebackType

import pika
from pika.adapters.blocking_connection import BlockingChannel

from serving_core.stream.amqp import QUORUM, AmqpSink
from serving_core.stream.base import Outgoing
from tests.rabbitmq_server import RabbitMQServer, rabbitmq_server

Item = tuple[str, bytes, dict[str, str]]


class AmqpBroker:
    """``with AmqpBroker() as broker:`` starts a node of its own and stops it after;
    ``AmqpBroker(server, prefix)`` uses a running one (its queues named apart by
    ``prefix``) and leaves it running."""

    counts_deliveries = True
    client_reconnects = False

    def __init__(self, server: RabbitMQServer | None = None, prefix: str = "") -> None:
        self._server = server
        self._own = None if server else rabbitmq_server()
        self.queue = f"{prefix}requests"
        self.results_queue = f"{prefix}results"
        self.dead_queue = f"{prefix}dead"
        self._results: list[Item] = []
        self._dead: list[Item] = []

    def __enter__(self) -> AmqpBroker:
        if self._own is not None:
            self._server = self._own.__enter__()
        url = self.server.url
        self.source_url = f"{url}?queue={self.queue}"
        self.sink_url = f"{url}?exchange={self.results_queue}&routing_key={self.results_queue}"
        self.dead_url = f"{url}?exchange={self.dead_queue}&routing_key={self.dead_queue}"
        try:
            self._declare()
        except BaseException as error:
            self.__exit__(type(error), error, error.__traceback__)
            raise
        return self

    def _declare(self) -> None:
        """The readers' side, declared before anything is produced or published."""
        with self._channel() as channel:
            channel.queue_declare(self.queue, durable=True, arguments=QUORUM)
            for name in (self.results_queue, self.dead_queue):
                channel.exchange_declare(name, exchange_type="direct", durable=True)
                channel.queue_declare(name, durable=True, arguments=QUORUM)
                channel.queue_bind(name, name, routing_key=name)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._own is not None:
            self._own.__exit__(kind, error, traceback)

    @property
    def server(self) -> RabbitMQServer:
        assert self._server is not None, "use AmqpBroker in a with block"
        return self._server

    def _channel(self) -> _Channel:
        return _Channel(self.server.url)

    def produce(self, items: list[Item], *, one_batch: bool = False) -> None:
        """Persistent messages with their message_id and headers, every one confirmed."""
        sink = AmqpSink(f"{self.server.url}?routing_key={self.queue}")
        try:
            sink.publish([Outgoing(id_, body, headers) for id_, body, headers in items])
        finally:
            sink.close()

    def results(self) -> list[Item]:
        """Every result published so far (taken off the queue and kept here)."""
        self._results += self._drain(self.results_queue)
        return list(self._results)

    def dead(self) -> list[Item]:
        self._dead += self._drain(self.dead_queue)
        return list(self._dead)

    def lag(self) -> int:
        """The source queue's ready messages."""
        with self._channel() as channel:
            declared = channel.queue_declare(self.queue, passive=True)
            return int(declared.method.message_count or 0)

    def restart(self) -> None:
        self.server.restart()

    def _drain(self, queue: str) -> list[Item]:
        # auto_ack: a message is the reader's once handed over. With one multiple ack at
        # the end of each drain, the reader once read 9,967 results where the worker had
        # published 5,000 (its own counter, and each message consumed once): messages
        # this reader had taken came back to it. A reader that keeps what it took must
        # take each once.
        items: list[Item] = []
        with self._channel() as channel:
            while True:
                method, properties, body = channel.basic_get(queue, auto_ack=True)
                if method is None or properties is None:
                    break
                headers = {str(k): str(v) for k, v in (properties.headers or {}).items()}
                headers.pop("x-delivery-count", None)
                items.append((properties.message_id or "", body or b"", headers))
        return items


class _Channel:
    """A connection's channel for one ``with`` block."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> BlockingChannel:
        self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        return self.connection.channel()

    def __exit__(self, *_: object) -> None:
        self.connection.close()
