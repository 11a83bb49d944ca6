"""A Kafka consumer group's member as a stream's source (``KafkaSource``).

Taken in order within each partition; acked by committing, per partition, the
offset after the last message acked, once the consumer's results are confirmed
(at-least-once: the commit is the ack). A consumer that dies holding messages
loses none: once its session times out (``session.timeout.ms``), the group
rebalances and its partitions' new owners start at the committed offsets.

Rebalances (incremental: only the partitions that change hands are revoked): on
a partition's revocation (a consumer joined, left, or was stopped) the source
commits what was acked, synchronously, before the partition moves; messages
taken from it and not yet acked are then the new owner's, and their late ack
here commits nothing (each message carries the generation of its partition's
assignment). A partition lost outright (a session that timed out)
commits nothing either. The new owner runs those messages again: a result may
be published twice, once per delivery, never for an offset that was committed.

Kafka keeps no delivery count: every message is handed out as a first delivery,
so SERVING_STREAM_MAX_ATTEMPTS counts the model's failures (isolation), and a
message that kills its consumer outright is handed out again, by offset, until
one survives it (docs/streams.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from serving_core.stream.base import BrokerError, Message
from serving_core.stream.kafka.config import parse

log = logging.getLogger("serving_core.stream.kafka")

# librdkafka's defaults, ours unless the URL says otherwise: start a new group at the
# topic's beginning (as Redis Streams and RabbitMQ hand out what was there before).
# queued.max.messages.kbytes: fetch ahead 16 MiB, not librdkafka's 64 MiB, per consumer
# process (a pod runs several). fetch.wait.max.ms: Kafka answers a fetch as soon as a
# record arrives, but Kafka-protocol brokers that hold it for the whole wait exist
# (Tansu, which the tests run: a message to an idle consumer waited up to librdkafka's
# 500 ms); 100 ms bounds that, for ten empty fetches a second on an idle Kafka.
# partition.assignment.strategy: incremental rebalances, so that a consumer joining or
# leaving moves only the partitions that change hands, and the others' consumers go on
# (with the eager default every member gives up every partition, commits, and waits).
SOURCE_DEFAULTS = {
    "partition.assignment.strategy": "cooperative-sticky",
    "auto.offset.reset": "earliest",
    "enable.partition.eof": False,
    "queued.max.messages.kbytes": 16384,
    "fetch.wait.max.ms": 100,
}
# Consumer errors that mean the source cannot go on as it is: its ends are opened again.
FAILED = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
}
ID_HEADER = "id"
ORIGIN_HEADER = "source-offset"


class KafkaSource:
    """Messages of a topic for a consumer group's member; acked by committed offsets."""

    def __init__(self, url: str, *, batch_size: int, consumer: str) -> None:
        end = parse(url, "a Kafka source")
        self.topic, self.shown = end.topic, end.shown
        config = {
            **SOURCE_DEFAULTS,
            "client.id": consumer or "serving-core",
            **end.config,
            "group.id": end.group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "on_commit": self._on_commit,
        }
        # partition -> the generation of its assignment: a message keeps the one it was
        # taken under, and is committed only while it is still current.
        self._generation: dict[int, int] = {}
        self._generations = 0
        self._acked: dict[int, int] = {}  # partition -> the offset to commit next
        self._first: dict[int, int] = {}  # partition -> the first offset taken, till an ack
        self._high: dict[int, int] = {}  # partition -> the high watermark last seen
        self._lags: dict[int, int] = {}
        try:
            self.consumer = Consumer(config, logger=log)
            self.consumer.subscribe(
                [self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
            )
        except KafkaException as error:
            raise BrokerError(f"{self.shown}: cannot subscribe: {error}") from error

    def take(self, max_n: int, wait_s: float) -> list[Message]:
        """What the consumer has fetched, up to ``max_n``; waits at most ``wait_s`` for the
        first (librdkafka's batch consume would wait for all ``max_n``)."""
        try:
            records = self.consumer.consume(max_n, 0)
            if not records and wait_s > 0:
                first = self.consumer.poll(wait_s)
                if first is not None:
                    records = [first, *self.consumer.consume(max_n - 1, 0)]
        except (KafkaException, RuntimeError) as error:
            raise BrokerError(f"{self.shown}: cannot consume: {error}") from error
        messages = []
        for record in records:
            failed = record.error()
            if failed is not None:
                self._consumer_error(failed)
                continue
            messages.append(self._message(record))
        return messages

    def _message(self, record: Any) -> Message:
        partition, offset = int(record.partition()), int(record.offset())
        self._high[partition] = max(self._high.get(partition, 0), offset + 1)
        headers: dict[str, str] = {}
        for name, value in record.headers() or ():
            headers[name] = value.decode(errors="replace") if value is not None else ""
        origin = f"{self.topic}/{partition}/{offset}"
        message_id = headers.pop(ID_HEADER, "") or origin
        headers[ORIGIN_HEADER] = origin
        generation = self._generation.get(partition, -1)
        self._first.setdefault(partition, offset)
        return Message(
            message_id,
            record.value() or b"",
            headers,
            tag=(partition, offset, generation),
            key=record.key(),
        )

    def _consumer_error(self, error: KafkaError) -> None:
        if error.fatal() or error.code() in FAILED:
            raise BrokerError(f"{self.shown}: {error.str()}")
        # Transport errors and the like: librdkafka reconnects by itself, and the
        # consumer goes on where it was once the broker is back.
        log.warning("Kafka source %s: %s", self.shown, error.str())

    def ack(self, messages: Sequence[Message]) -> None:
        """Commits, per partition, the offset after the last of ``messages`` (in order
        within a partition, as taken), without waiting: a commit that is lost leaves its
        messages to be handed out again. Messages of a partition that has since been
        revoked commit nothing."""
        ahead: dict[int, int] = {}
        for message in messages:
            partition, offset, generation = cast(tuple[int, int, int], message.tag)
            if self._generation.get(partition) == generation:
                ahead[partition] = max(ahead.get(partition, 0), offset + 1)
        if not ahead:
            return
        self._acked.update(ahead)
        self._commit(ahead, asynchronous=True)

    def _commit(self, offsets: dict[int, int], *, asynchronous: bool) -> None:
        wanted = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        try:
            if asynchronous:  # its outcome comes to _on_commit
                self.consumer.commit(offsets=wanted, asynchronous=True)
            else:
                for tp in self.consumer.commit(offsets=wanted, asynchronous=False):
                    if tp.error is not None:
                        raise KafkaException(tp.error)
        except KafkaException as error:
            if error.args[0].code() == KafkaError._NO_OFFSET:
                return
            raise BrokerError(f"{self.shown}: cannot commit offsets: {error}") from error

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """An asynchronous commit's outcome: one that failed leaves its messages to be
        handed out again (the next commit, or the revocation's, covers them)."""
        failed = [tp for tp in partitions if tp.error is not None]
        if (error is not None and error.code() != KafkaError._NO_OFFSET) or failed:
            log.warning("Kafka source %s: a commit failed: %s", self.shown, error or failed)

    def _assigned(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._generations += 1
        for tp in partitions:
            self._generation[tp.partition] = self._generations
        log.info("Kafka source %s: assigned partitions %s", self.shown, _names(partitions))

    def _revoked(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        """Before the partitions move: commit what was acked, and wait for it."""
        revoked = {tp.partition for tp in partitions}
        done = {p: o for p, o in self._acked.items() if p in revoked}
        if done:
            try:
                self._commit(done, asynchronous=False)
            except BrokerError as error:  # the new owner starts earlier: at-least-once
                log.warning("%s; their messages will be handed out again", error)
        self._forget(revoked)
        log.info("Kafka source %s: revoked partitions %s", self.shown, _names(partitions))

    def _lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        """Taken by others already (this consumer's session expired): commit nothing."""
        self._forget({tp.partition for tp in partitions})
        log.warning("Kafka source %s: lost partitions %s", self.shown, _names(partitions))

    def _forget(self, partitions: set[int]) -> None:
        for partition in partitions:
            self._generation.pop(partition, None)
            self._acked.pop(partition, None)
            self._first.pop(partition, None)
            self._high.pop(partition, None)
            if partition in self._lags:
                self._lags[partition] = 0  # no longer this consumer's to report

    def lag(self) -> int | None:
        """None: a consumer knows only its own partitions (``partition_lags``)."""
        return None

    def partition_lags(self) -> dict[str, int]:
        """Per partition this consumer holds: the high watermark (as its last fetch saw
        it) less the offset to commit next; 0 for those it gave up since."""
        for partition in list(self._generation):
            tp = TopicPartition(self.topic, partition)
            try:
                _, high = self.consumer.get_watermark_offsets(tp, cached=True)
            except KafkaException:
                continue
            high = max(high, self._high.get(partition, 0))
            # Done up to the last ack; else up to the first message taken (nothing
            # taken yet: nothing known, as the fetch has not begun).
            done = self._acked.get(partition, self._first.get(partition))
            if high >= 0 and done is not None:
                self._lags[partition] = max(0, high - done)
        return {f"{self.topic}/{p}": lag for p, lag in sorted(self._lags.items())}

    def close(self) -> None:
        """Leaves the group: the revocation commits what was acked (``_revoked``)."""
        try:
            self.consumer.close()
        except (KafkaException, RuntimeError) as error:
            log.debug("closing the Kafka source %s: %s", self.shown, error)


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(str(tp.partition) for tp in partitions) or "none"
