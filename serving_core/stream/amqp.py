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
message); the consumer confirms a batch after running the next one, so the wait
for a quorum queue's fsync overlaps the model.

Any other query parameter is pika's own (``heartbeat=30``, ``socket_timeout=5``
...). Neither class is thread-safe: each belongs to the thread that made it.
Heartbeats are sent only inside take, ack, lag and publish: a handler call
longer than the heartbeat timeout (the broker proposes 60 s) can lose the
connection, and its batch is delivered again; such a model needs a longer
``heartbeat=`` on its source URL.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.channel import Channel
from pika.frame import Method
from pika.spec import Basic, BasicProperties

from serving_core.stream.amqp_connection import ERRORS, Connected, amqp_url
from serving_core.stream.base import BrokerError, Message, Outgoing, Refused

QUORUM = {"x-queue-type": "quorum"}
# Unacked at once: a batch awaiting its confirms, the batch running, the next one.
PREFETCH_BATCHES = 3
# What an end is called in errors, the query keys its URL takes, and those it needs.
SOURCE_URL = ("an AMQP source", ["queue"], ["queue"])
SINK_URL = ("an AMQP sink", ["exchange", "routing_key"], ["routing_key"])


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


class AmqpSink(Connected):
    """Publishes to an exchange with publisher confirms, a batch at a time."""

    def __init__(self, url: str, *, confirm_timeout_s: float = 60.0) -> None:
        super().__init__(url, *SINK_URL)
        self.exchange = self.options.get("exchange", "")
        self.routing_key = self.options["routing_key"]
        self.confirm_timeout_s = confirm_timeout_s
        self._nacked: list[str] = []
        self._returned: list[str] = []
        try:
            if self.exchange:
                self.channel.exchange_declare(self.exchange, exchange_type="direct", durable=True)
            self._confirming()
        except ERRORS as error:
            self.close()
            raise self.failed(f"cannot publish to exchange {self.exchange!r}", error) from error
        except BrokerError:
            self.close()
            raise

    def _confirming(self) -> None:
        """The channel in confirm mode, with this sink's callbacks; a new channel's
        delivery tags count from 1 again."""
        self._sent = 0  # confirm-mode delivery tags count publishes from 1
        self._unconfirmed: dict[int, Outgoing] = {}
        self._unsent: list[Outgoing] = []  # not published: the channel was closed first
        self._refusal: str | None = None  # why the broker closed the channel on a message
        self._selected = False
        self.channel.add_on_return_callback(self._on_return)
        # BlockingChannel.confirm_delivery waits for each publish's confirm before the
        # next one (a round trip per message); the channel underneath takes a
        # callback instead, so a batch's confirms are awaited together.
        impl = cast(Channel, self.channel._impl)  # type: ignore[attr-defined]
        impl.add_on_close_callback(self._on_close)
        impl.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_select_ok)
        self._wait(lambda: self._selected, "Confirm.Select")

    def _on_select_ok(self, _frame: object) -> None:
        self._selected = True
        self._wake()

    def _on_close(self, _channel: Channel, reason: Exception) -> None:
        # PRECONDITION_FAILED on a publish is the broker refusing one message (over
        # max_message_size, say): the channel is gone, the connection is not.
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker) and reason.reply_code == 406:
            self._refusal = f"{reason.reply_code} {reason.reply_text}"
        self._wake()

    def _wake(self) -> None:
        # A due timer is an event the blocking connection returns for: process_data_events
        # stops waiting now instead of at its time limit.
        if self.connection.is_open:
            self.connection.call_later(0, lambda: None)

    def _on_confirm(self, frame: Method[Basic.Ack | Basic.Nack]) -> None:
        method = frame.method
        tag = int(method.delivery_tag)
        done = [t for t in self._unconfirmed if t <= tag] if method.multiple else [tag]
        for t in done:
            message = self._unconfirmed.pop(t, None)
            if isinstance(method, Basic.Nack):
                self._nacked.append(message.id if message else "")
        if not self._unconfirmed:
            self._wake()

    def _on_return(
        self,
        _channel: BlockingChannel,
        method: Basic.Return,
        properties: BasicProperties,
        _body: bytes,
    ) -> None:
        self._returned.append(f"{properties.message_id!r} ({method.reply_text})")

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.confirm_timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrokerError(f"{self.shown}: no {what} after {self.confirm_timeout_s} s")
            if self._refusal is not None:
                raise self._refused()
            if self.channel.is_closed:
                raise BrokerError(f"{self.shown}: the broker closed the channel")
            # At most a second at a time: a channel the broker closes wakes nothing.
            self.connection.process_data_events(time_limit=min(left, 1.0))

    def _refused(self) -> Refused:
        """What the closed channel left unconfirmed, on a new channel for what follows."""
        refused = Refused(
            f"{self.shown}: the broker refused a message: {self._refusal}",
            [*self._unconfirmed.values(), *self._unsent],
        )
        self._returned, self._nacked = [], []
        try:
            self.channel = self.connection.channel()
            self._confirming()
        except ERRORS as error:
            raise self.failed("cannot open a channel again", error) from error
        return refused

    def send(self, messages: Sequence[Outgoing]) -> None:
        try:
            for i, message in enumerate(messages):
                if self._refusal is not None:  # the channel is gone: confirm says so
                    self._unsent += messages[i:]
                    return
                properties = BasicProperties(
                    content_type="application/json",
                    delivery_mode=pika.DeliveryMode.Persistent,
                    message_id=message.id,
                    correlation_id=message.id,
                    headers=dict(message.headers) or None,
                )
                # Counted before it is sent: its confirm can arrive while basic_publish
                # still flushes the socket (it reads as it writes).
                self._sent += 1
                self._unconfirmed[self._sent] = message
                try:
                    self.channel.basic_publish(
                        self.exchange, self.routing_key, message.body, properties, mandatory=True
                    )
                except pika.exceptions.ChannelClosed:
                    if self._refusal is None:
                        raise
        except ERRORS as error:
            raise self.failed("cannot publish", error) from error

    def confirm(self) -> None:
        # Confirms that came while the caller ran its next batch wait in the socket's
        # buffer; the first read dispatches them, so this wait is then no wait.
        try:
            self._wait(lambda: not (self._unconfirmed or self._unsent), "publisher confirm")
            # A return comes before its message's confirm; this dispatches it.
            self.connection.process_data_events(time_limit=0)
        except ERRORS as error:
            raise self.failed("cannot publish", error) from error
        returned, self._returned = self._returned, []
        nacked, self._nacked = self._nacked, []
        if returned:
            raise BrokerError(
                f"{self.shown}: unroutable: no queue is bound to exchange {self.exchange!r} "
                f"with routing key {self.routing_key!r}; returned: {', '.join(returned[:5])}"
            )
        if nacked:
            raise BrokerError(f"{self.shown}: the broker nacked {len(nacked)} message(s)")

    def publish(self, messages: Sequence[Outgoing]) -> None:
        if messages:
            self.send(messages)
            self.confirm()
