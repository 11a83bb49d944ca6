"""RabbitMQ (AMQP 0-9-1, with pika): a durable quorum queue in, an exchange out;
the broker of ``amqp://`` and ``amqps://`` (``stream.brokers``).

In: ``amqp://USER:PASS@HOST:PORT/VHOST?queue=NAME``. The queue is declared
durable, of type quorum (declared again if it exists: RabbitMQ refuses one of
another type, and says so); prefetch is three batches: the one whose results
await their confirms, the one the handler runs, and the next, already on its
way. A message's
``message_id`` is its id; one without it is handed out with the id ``""``, and
the consumer dead-letters it (its result could not be matched to its input).

Out: ``amqp://USER:PASS@HOST:PORT/VHOST?exchange=NAME&routing_key=KEY``. A
named exchange is declared durable, of type direct; ``exchange=`` empty (or
left out) is the default exchange, where the routing key is a queue's name.
Binding a queue to the exchange is the reader of the results' business.
Publishing is mandatory and confirmed: a batch is sent whole (``send``), and
every confirm is awaited at once (``confirm``: one round trip per batch, not per
message); the consumer confirms a batch while the next one runs, so the wait
for a quorum queue's fsync overlaps the model.

Any other query parameter is pika's own (``heartbeat=30``, ``socket_timeout=5``
...). Neither class is thread-safe: each belongs to the thread that made it.
pika sends heartbeats only inside a call, so while a batch runs on the model's
thread, and after each take that found nothing, the consumer's thread calls
``keepalive`` on both (``base.KeptAlive``): a batch or a pause longer than the
heartbeat timeout keeps its connections.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from pika.adapters.blocking_connection import BlockingChannel
from pika.frame import Method
from pika.spec import Basic, BasicProperties

from serving_core.stream.amqp_connection import ERRORS, Connected, amqp_url
from serving_core.stream.amqp_sink import SINK_URL, AmqpSink
from serving_core.stream.base import BrokerError, Message

QUORUM = {"x-queue-type": "quorum"}
# Unacked at once: a batch awaiting its confirms, the batch running, the next one.
PREFETCH_BATCHES = 3
# What an end is called in errors, the query keys its URL takes, and those it needs.
SOURCE_URL = ("an AMQP source", ["queue"], ["queue"])


def check_source(url: str) -> None:
    amqp_url(url, *SOURCE_URL)


def check_sink(url: str) -> None:
    amqp_url(url, *SINK_URL)


def open_source(url: str, batch_size: int, consumer: str) -> AmqpSource:
    return AmqpSource(url, batch_size=batch_size, consumer=consumer)


def open_sink(url: str) -> AmqpSink:
    return AmqpSink(url)


def _deliveries(redelivered: bool, count: object) -> int:
    """This delivery's number. A quorum queue sets ``x-delivery-count`` on a message it
    hands out again (with the ``redelivered`` flag); on a first delivery the header can
    only be a producer's, which neither crashes the consumer (not a number) nor
    dead-letters the message unrun (a forged count)."""
    if not redelivered:
        return 1
    if isinstance(count, int) and not isinstance(count, bool) and count > 0:
        return count + 1
    return 2  # handed out again, the broker's count unreadable: at least the second


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class AmqpSource(Connected):
    """Messages from a durable quorum queue, acked by delivery tag."""

    def __init__(self, url: str, *, batch_size: int, consumer: str) -> None:
        super().__init__(url, *SOURCE_URL)
        self.queue = self.options["queue"]
        # Each delivery's tag with this source's own token: a message taken before a
        # reconnect carries a tag of a channel that is gone (see ack).
        self._token = object()
        self._taken: deque[Message] = deque()
        self._unacked: set[int] = set()
        self._lag_channel: BlockingChannel | None = None
        self._cancelled = False
        try:
            self.channel.queue_declare(self.queue, durable=True, arguments=QUORUM)
            self.channel.basic_qos(prefetch_count=PREFETCH_BATCHES * batch_size)
            self.channel.add_on_cancel_callback(self._on_cancel)
            self.channel.basic_consume(self.queue, self._on_message, consumer_tag=consumer or None)
        except ERRORS as error:
            self.close()
            raise self.failed(f"cannot consume from queue {self.queue!r}", error) from error

    def _on_message(
        self,
        _channel: BlockingChannel,
        method: Basic.Deliver,
        properties: BasicProperties,
        body: bytes,
    ) -> None:
        headers: dict[str, Any] = dict(properties.headers or {})
        # The broker's count, not the producer's header: it does not travel to the result.
        count = headers.pop("x-delivery-count", None)
        tag = int(method.delivery_tag or 0)
        self._unacked.add(tag)
        self._taken.append(
            Message(
                id=properties.message_id or "",
                body=body,
                headers={str(k): _text(v) for k, v in headers.items()},
                deliveries=_deliveries(bool(method.redelivered), count),
                tag=(self._token, tag),
            )
        )

    def _on_cancel(self, _frame: Method[Basic.Cancel]) -> None:
        self._cancelled = True

    def take(self, max_n: int, wait_s: float) -> list[Message]:
        deadline = time.monotonic() + wait_s
        try:
            self.connection.process_data_events(time_limit=0)
            while (
                not (self._taken or self._cancelled) and (left := deadline - time.monotonic()) > 0
            ):
                # Returns as soon as a delivery is dispatched (or at the time limit).
                self.connection.process_data_events(time_limit=left)
        except ERRORS as error:
            raise self.failed("cannot take messages", error) from error
        if self._cancelled:
            # Otherwise the source would wait for deliveries that never come.
            raise BrokerError(
                f"{self.shown}: the broker cancelled the consumer of queue {self.queue!r} "
                "(the queue was deleted?); a new source declares it again"
            )
        return [self._taken.popleft() for _ in range(min(max_n, len(self._taken)))]

    def ack(self, messages: Sequence[Message]) -> None:
        tags = {tag for tag in map(self._own_tag, messages) if tag in self._unacked}
        if not tags:
            return
        # The longest run of the oldest unacked tags goes in one multiple ack.
        upto = 0
        for tag in sorted(self._unacked):
            if tag not in tags:
                break
            upto = tag
        try:
            if upto:
                self.channel.basic_ack(upto, multiple=True)
            for tag in sorted(t for t in tags if t > upto):
                self.channel.basic_ack(tag)
        except ERRORS as error:
            raise self.failed("cannot ack", error) from error
        self._unacked -= tags

    def _own_tag(self, message: Message) -> int | None:
        """Its delivery tag on this source's channel. A message taken before a reconnect
        has none here: the broker hands it out again, which at-least-once allows."""
        tag = message.tag
        if isinstance(tag, tuple) and len(tag) == 2 and tag[0] is self._token:
            return int(tag[1])
        return None

    def lag(self) -> int | None:
        """The queue's ready messages (those handed out and not yet acked are not counted)."""
        try:
            if self._lag_channel is None or not self._lag_channel.is_open:
                # Its own channel: a failed passive declare closes the channel it ran on.
                self._lag_channel = self.connection.channel()
            declared = self._lag_channel.queue_declare(self.queue, passive=True)
        except ERRORS as error:
            raise self.failed(f"cannot read the depth of queue {self.queue!r}", error) from error
        return int(declared.method.message_count or 0)
