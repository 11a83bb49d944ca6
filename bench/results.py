"""What a stream bench reads of a broker's results (``Results``), for ``stream.py``,
``consumer_cpu.py`` and ``framework_cost.py``."""

from __future__ import annotations

from typing import Any

import redis

from tests.stream.kafka_broker import GROUP, PARTITIONS


class Results:
    """How many results a broker holds, and which arrived since the last look, cheaply:
    the stream's XLEN and XREAD from the last id; the queue's depth (a passive declare)
    and a drain; on Kafka, the inputs the group committed (each once its result was
    confirmed), and the results topic read on by a reader that keeps its place. A poll
    must not cost the server the CPU it is measured on."""

    def __init__(self, backend: str, broker: Any) -> None:
        self.backend, self.broker = backend, broker
        self.last_id = "0-0"
        self.taken = 0
        if backend == "redis":
            self.client = redis.Redis.from_url(broker.sink_url.split("?")[0])
        elif backend == "kafka":
            # Counted by the group's committed offsets (an input's offset is committed
            # once its result is confirmed), one OffsetFetch a look: a reader of the
            # results fetching every 10 ms took 0.055 of Tansu's cores (a third of the
            # broker's share in a round), and a reader fetching while records are
            # produced can miss some on Tansu (tests/stream/README.md).
            from confluent_kafka import Consumer, TopicPartition

            self.probe = Consumer({**broker.client, "group.id": GROUP})
            self.inputs = [TopicPartition("in", p) for p in range(PARTITIONS["in"])]
        elif backend == "amqp":
            import pika

            self.connection = pika.BlockingConnection(pika.URLParameters(broker.server.url))
            self.channel = self.connection.channel()

    def count(self) -> int:
        if self.backend == "redis":
            return int(self.client.xlen("out"))
        if self.backend == "kafka":
            committed = self.probe.committed(self.inputs, timeout=10)
            return sum(max(0, tp.offset) for tp in committed)
        depth = self.channel.queue_declare(self.broker.results_queue, passive=True)
        return self.taken + int(depth.method.message_count or 0)

    def new_ids(self) -> list[str]:
        if self.backend == "redis":
            got = self.client.xread({"out": self.last_id}, count=10_000)
            ids = []
            for _, entries in got:
                for entry_id, fields in entries:
                    self.last_id = entry_id.decode()
                    ids.append(fields[b"id"].decode())
            return ids
        # Drains the results queue (reads the topic on), and keeps what it took.
        if self.backend == "kafka":
            items = [(r.id, r.body, r.headers) for r in self.broker.records("out", wait_s=0)]
        else:
            items = self.broker.results()
        new, self.taken = items[self.taken :], len(items)
        return [item[0] for item in new]

    def close(self) -> None:
        if self.backend == "redis":
            self.client.close()
        elif self.backend == "kafka":
            self.probe.close()
        elif self.backend == "amqp":
            self.connection.close()
