"""RabbitMQ's sink (``AmqpSink``): results, or dead letters, to an exchange, with
publisher confirms, a batch at a time (``stream.amqp`` is the broker's module).

A publish the broker refuses for the message itself (406 PRECONDITION_FAILED:
over ``max_message_size``, say) closes the channel, not the connection: the
sink opens a new channel, and ``confirm`` raises ``Refused`` with what the
closed one had not confirmed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import cast

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.channel import Channel
from pika.frame import Method
from pika.spec import Basic, BasicProperties

from serving_core.stream.amqp_connection import ERRORS, Connected
from serving_core.stream.base import BrokerError, Outgoing, Refused

SINK_URL = ("an AMQP sink", ["exchange", "routing_key"], ["routing_key"])


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
        if self._refusal is not None:  # the channel is gone: confirm says so
            self._unsent += messages
            return
        # The batch's frames go into the connection's buffer through the channel
        # underneath, then out in one flush: BlockingChannel.basic_publish flushes (a
        # poll and a send, and the writer watched and unwatched) for every message.
        impl = cast(Channel, self.channel._impl)  # type: ignore[attr-defined]
        try:
            try:
                for message in messages:
                    properties = BasicProperties(
                        content_type="application/json",
                        delivery_mode=pika.DeliveryMode.Persistent,
                        message_id=message.id,
                        correlation_id=message.id,
                        headers=dict(message.headers) or None,
                    )
                    # Counted before it is sent: its confirm can arrive while the flush
                    # still writes to the socket (it reads as it writes).
                    self._sent += 1
                    self._unconfirmed[self._sent] = message
                    impl.basic_publish(
                        self.exchange, self.routing_key, message.body, properties, mandatory=True
                    )
                if messages:
                    self.channel._flush_output()  # type: ignore[attr-defined]
            except pika.exceptions.ChannelClosed:
                # A message the broker refused closed the channel (``_on_close``): the
                # ones it did not confirm, that one and those after it, are still in
                # ``_unconfirmed``, and confirm raises ``Refused`` with them.
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
