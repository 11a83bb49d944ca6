"""A Kafka producer as a stream's sink (``KafkaSink``): results, or dead letters.

Each result goes to the sink's topic under its input's key (so a reader of the
results keeps the inputs' order per key; Java's partitioner, murmur2, so that
Java and Kafka Streams readers agree on the partition), with the input's headers
and its id in the ``id`` header. The producer is idempotent: its retries neither
duplicate nor reorder a partition's results. ``confirm`` waits for every
delivery report; one failure (or ``message.timeout.ms`` passing with the broker
away) is a ``BrokerError``, and the consumer does not ack the inputs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from serving_core.stream.base import BrokerError, Outgoing, Refused
from serving_core.stream.kafka.config import parse
from serving_core.stream.kafka.source import ID_HEADER

log = logging.getLogger("serving_core.stream.kafka")

# librdkafka's defaults, ours unless the URL says otherwise. message.timeout.ms: how
# long a result waits for a broker that is away before confirm gives up (librdkafka's
# 300 s would hold the consumer that long); linger.ms: a batch's results go in one
# request per partition.
SINK_DEFAULTS = {
    "enable.idempotence": True,
    "partitioner": "murmur2_random",
    "message.timeout.ms": 30000,
    "linger.ms": 2,
}
FLUSH_STEP_S = 1.0
# Errors that refuse the message itself (its size: message.max.bytes, or the topic's
# max.message.bytes): sent again, it would be refused again.
REFUSED = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE}


class KafkaSink:
    """Produces results to a topic; ``confirm`` waits for the delivery reports."""

    def __init__(self, url: str) -> None:
        end = parse(url, "a Kafka sink")
        self.topic, self.shown = end.topic, end.shown
        config = {**SINK_DEFAULTS, "client.id": "serving-core", **end.config}
        self._timeout_s = int(config["message.timeout.ms"]) / 1000
        self._failed: KafkaError | None = None
        self._refused: list[tuple[Outgoing, str]] = []
        try:
            self.producer = Producer(config, logger=log)
        except KafkaException as error:
            raise BrokerError(f"{self.shown}: cannot make a producer: {error}") from error

    def _delivered(self, message: Outgoing, error: KafkaError | None, _record: Any) -> None:
        if error is None:
            return
        if error.code() in REFUSED:
            self._refused.append((message, error.str()))
        elif self._failed is None:
            self._failed = error

    def send(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            headers: list[tuple[str, str | bytes | None]] = [
                *message.headers.items(),
                (ID_HEADER, message.id),
            ]
            while True:
                try:
                    self.producer.produce(
                        self.topic,
                        value=message.body,
                        key=message.key,
                        headers=headers,
                        on_delivery=partial(self._delivered, message),
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self.producer.poll(0.05)
                except KafkaException as error:
                    if error.args[0].code() not in REFUSED:
                        raise BrokerError(f"{self.shown}: cannot produce: {error}") from error
                    self._refused.append((message, error.args[0].str()))  # by librdkafka
                    break
        self.producer.poll(0)

    def confirm(self) -> None:
        """Every result sent so far delivered, or ``BrokerError``."""
        deadline = time.monotonic() + self._timeout_s + FLUSH_STEP_S
        while self.producer.flush(FLUSH_STEP_S) > 0:
            if self._failed is not None or time.monotonic() > deadline:
                break
        failed, self._failed = self._failed, None
        refused, self._refused = self._refused, []
        if failed is None and refused:
            said = ", ".join(f"{message.id!r} ({why})" for message, why in refused[:5])
            raise Refused(f"{self.shown}: refused: {said}", [message for message, _ in refused])
        if failed is not None:
            raise BrokerError(f"{self.shown}: a result was not delivered: {failed.str()}")
        if len(self.producer) > 0:
            raise BrokerError(f"{self.shown}: results still undelivered after {self._timeout_s} s")

    def publish(self, messages: Sequence[Outgoing]) -> None:
        self.send(messages)
        self.confirm()

    def close(self) -> None:
        # What is still queued was never confirmed, so its inputs were never acked.
        self.producer.purge()
        self.producer.flush(0)
