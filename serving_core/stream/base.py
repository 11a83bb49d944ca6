"""A stream's ends: a ``MessageSource`` of messages and a ``MessageSink`` for results.

Delivery is at-least-once: the consumer acks a message to its source only after
the sink has confirmed the message's result (or its dead letter). A consumer
that dies holding unacked messages loses none: the broker hands them out again
(RabbitMQ on the channel's close; Redis Streams through the consumer group's
pending entries, claimed once idle; Kafka through the consumer group's
committed offsets). Another broker is one more module with a ``MessageSource``,
a ``MessageSink`` and the functions of ``brokers.Broker``, and its schemes'
lines in ``brokers.BROKERS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class BrokerError(Exception):
    """The broker cannot be reached, or did not confirm: the worker reconnects with
    back-off and the source hands the unacked messages out again."""


class Refused(BrokerError):
    """The broker refused a message for what it is (too large, say), not for its own
    state: sent again, it would be refused again. Raised by ``MessageSink.confirm``;
    ``undelivered`` are those sent since the last confirm that the broker may not
    have (the refused one among them), and everything else sent is confirmed. The
    sink is usable again: each of them sent alone tells which was refused."""

    def __init__(self, reason: str, undelivered: Sequence[Outgoing]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.undelivered = list(undelivered)


@dataclass(frozen=True)
class Message:
    """One record taken from a source, not yet acked."""

    id: str  # the producer's message id (AMQP message_id), or the stream entry's id
    body: bytes  # the handler's params as JSON, as the producer sent them
    headers: dict[str, str] = field(default_factory=dict)  # travel to the result
    # How many times the broker has handed this message out, this time included
    # (quorum queues' x-delivery-count + 1; XPENDING's delivery count).
    deliveries: int = 1
    tag: object = None  # the source's own handle for the ack (delivery tag, entry id)
    # The partitioning key (Kafka's): the result goes out under it, so that a reader
    # of the results keeps the inputs' order per key. None where the broker has none.
    key: bytes | None = None


@dataclass(frozen=True)
class Outgoing:
    """One result (or dead letter) for a sink: JSON bytes under the input's id."""

    id: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    key: bytes | None = None  # the input's key (``Message.key``)


class MessageSource(Protocol):
    def take(self, max_n: int, wait_s: float) -> list[Message]:
        """Up to ``max_n`` messages; waits at most ``wait_s`` for the first, returns
        [] when none came. Raises ``BrokerError`` when the broker is lost."""
        ...

    def ack(self, messages: Sequence[Message]) -> None:
        """Done with these: the broker forgets them. Raises ``BrokerError``."""
        ...

    def lag(self) -> int | None:
        """Messages waiting: the queue's depth, or the group's pending entries plus
        those not yet delivered; None when the broker cannot say."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class PartitionedSource(Protocol):
    """A source split into partitions that each consumer holds some of (Kafka's): its
    ``lag`` cannot say the whole source's, so it says its own partitions'."""

    def partition_lags(self) -> dict[str, int]:
        """Messages waiting per partition this consumer holds (``TOPIC/N``), and 0 for
        those it has given up since it last said."""
        ...


@runtime_checkable
class KeptAlive(Protocol):
    """An end whose client sends its heartbeats only when called (pika's blocking
    connection), where the others' clients do it on threads of their own: called
    while a long batch runs (``loops.stream``), so its connection is not dropped."""

    def keepalive(self) -> None:
        """Send and read what is due (heartbeats); raises ``BrokerError``."""
        ...


class MessageSink(Protocol):
    def send(self, messages: Sequence[Outgoing]) -> None:
        """Hands them to the broker without waiting for its confirmation, so that the
        wait can overlap the next batch's run; ``confirm`` waits. Raises ``BrokerError``."""
        ...

    def confirm(self) -> None:
        """Returns once the broker has confirmed everything sent (publisher confirms, or
        XADD's reply); raises ``Refused`` if the broker refused one for what it is,
        ``BrokerError`` otherwise, and the caller does not ack their inputs."""
        ...

    def publish(self, messages: Sequence[Outgoing]) -> None:
        """``send`` then ``confirm``."""
        ...

    def close(self) -> None: ...
