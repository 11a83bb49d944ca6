"""A real Kafka-protocol broker as a stream's broker, for tests/stream's end-to-end
tests: topics ``in`` (4 partitions, a consumer group's), ``out`` and ``dead``
(4 and 1) on a Tansu broker of its own (tests/kafka_server.py).

``produce`` sends each item under its id as key and ``id`` header; ``results`` and
``dead`` read their topic from the beginning, by a reader that keeps its place
(assigned partitions, no group: it never rebalances), and give each record's
``source-offset`` header back apart (``records``), so that the end-to-end tests
compare the headers the producer sent.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.kafka_server import KafkaServer
from tests.stream.redis_broker import Item

GROUP = "serving-core"
PARTITIONS = {"in": 4, "out": 4, "dead": 1}
# Short, so that a killed consumer's partitions move within the test (Kafka's default
# is 45 s); heartbeats a tenth of it, as Kafka advises.
SESSION = "session.timeout.ms=6000&heartbeat.interval.ms=600"
ORIGIN = "source-offset"
READ_WAIT_S = 0.2


@dataclass(frozen=True)
class Record:
    """A result or dead letter as Kafka holds it."""

    id: str
    body: bytes
    headers: dict[str, str]
    key: bytes | None
    partition: int
    offset: int
    origin: str  # the input's TOPIC/PARTITION/OFFSET (its ``source-offset`` header)


class KafkaBroker:
    """Topics ``in``, ``out`` and ``dead`` on a Tansu broker over ``s3`` (None: in
    memory, lost if it stops)."""

    counts_deliveries = False  # Kafka keeps no delivery count (docs/streams.md)
    client_reconnects = True

    def __init__(self, s3: str | None) -> None:
        self.server = KafkaServer(s3)
        # The readers' fetch.wait.max.ms. Tansu holds a fetch for the whole wait even
        # once a record is there (tests/stream/README.md), so bench/stream.py's
        # latencies, read through ``records``, need a short one; over S3 each fetch
        # reads moto's S3, and a reader fetching every 10 ms took the CPU the tests'
        # workers need, so there librdkafka's default.
        self._fetch_wait_ms = 10 if s3 is None else 500
        self.client: dict[str, str] = {"bootstrap.servers": self.server.bootstrap}
        base = f"kafka://{self.server.bootstrap}"
        self.source_url = f"{base}/in?group={GROUP}&{SESSION}"
        self.sink_url = f"{base}/out"
        self.dead_url = f"{base}/dead"
        self.produced: dict[str, tuple[int, int]] = {}  # id -> (partition, offset)
        self._readers: dict[str, Consumer] = {}
        self._read: dict[str, list[Record]] = {}

    def __enter__(self) -> KafkaBroker:
        self.server.start()
        admin = AdminClient(self.client)
        topics = [NewTopic(name, count, 1) for name, count in PARTITIONS.items()]
        for future in admin.create_topics(topics).values():
            future.result(30)
        self._producer = Producer({**self.client, "enable.idempotence": True})
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for reader in self._readers.values():
            with contextlib.suppress(Exception):
                reader.close()
        # Gone before the broker, or its threads log every failed reconnection.
        del self._producer
        self.server.stop()

    def restart(self) -> None:
        self.server.restart()

    def produce(
        self, items: list[Item], *, one_batch: bool = False, keys: list[bytes] | None = None
    ) -> None:
        """Each item under its id as key (or ``keys``'; ``one_batch``: all under one, in
        one partition), and its id in the ``id`` header."""

        failed: list[Any] = []

        def delivered(message_id: str, error: Any, record: Any) -> None:
            # A delivery report carries no headers: the id comes with the callback.
            if error is not None:
                failed.append(error)
            else:
                self.produced[message_id] = (record.partition(), record.offset())

        for n, (message_id, body, headers) in enumerate(items):
            key = keys[n] if keys else b"one" if one_batch else message_id.encode()
            self._producer.produce(
                "in",
                value=body,
                key=key,
                headers=[*headers.items(), ("id", message_id)],
                on_delivery=functools.partial(delivered, message_id),
            )
            self._producer.poll(0)
        assert self._producer.flush(30) == 0
        assert not failed, failed[:3]

    def records(self, topic: str, wait_s: float = READ_WAIT_S) -> list[Record]:
        """Every record of ``topic`` so far, in order within each partition; ``wait_s``:
        how long the last read waits for more (0: what the reader has fetched)."""
        reader = self._readers.get(topic)
        if reader is None:
            reader = Consumer(
                {
                    **self.client,
                    "group.id": "reader",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": self._fetch_wait_ms,
                }
            )
            count = PARTITIONS[topic]
            reader.assign([TopicPartition(topic, p, 0) for p in range(count)])
            self._readers[topic], self._read[topic] = reader, []
        while batch := reader.consume(1000, wait_s):
            for record in batch:
                if record.error() is None:
                    self._read[topic].append(_record(record))
        return list(self._read[topic])

    def results(self) -> list[Item]:
        return [(r.id, r.body, r.headers) for r in self.records("out")]

    def dead(self) -> list[Item]:
        return [(r.id, r.body, r.headers) for r in self.records("dead")]

    def committed(self) -> dict[int, int]:
        """The group's committed offset per partition of ``in`` (-1001: none yet)."""
        probe = Consumer({**self.client, "group.id": GROUP})
        try:
            wanted = [TopicPartition("in", p) for p in range(PARTITIONS["in"])]
            return {tp.partition: tp.offset for tp in probe.committed(wanted, timeout=10)}
        finally:
            probe.close()

    def lag(self) -> int:
        """Messages produced to ``in`` past the group's committed offsets. The ends come
        from the producer's delivery reports: Tansu's ListOffsets answers the first
        offset of the last batch, not the high watermark (tests/stream/README.md)."""
        ends: dict[int, int] = {}
        for partition, offset in self.produced.values():
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        committed = self.committed()
        return sum(end - max(committed.get(p, 0), 0) for p, end in ends.items())


def _record(record: Any) -> Record:
    headers = {name: (value or b"").decode() for name, value in record.headers() or ()}
    message_id = headers.pop("id")
    origin = headers.pop(ORIGIN)
    return Record(
        message_id,
        record.value(),
        headers,
        record.key(),
        record.partition(),
        record.offset(),
        origin,
    )
