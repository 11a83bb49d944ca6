"""Kafka: a consumer group in (``source.KafkaSource``), a producer out
(``sink.KafkaSink``), with confluent-kafka (librdkafka); the broker of
``kafka://`` and ``kafkas://`` (TLS) in ``stream.brokers``.

    kafka://HOST:9092[,HOST:9092]/TOPIC?group=NAME[&PROPERTY=VALUE...]   a source
    kafka://HOST:9092[,HOST:9092]/TOPIC[?PROPERTY=VALUE...]              a sink

A message in: its value is the params as JSON, its ``id`` header the id (its
``TOPIC/PARTITION/OFFSET`` otherwise), its other headers travel to the result,
with ``source-offset`` (``TOPIC/PARTITION/OFFSET``) added; its key is the
result's key. The URL's grammar is ``config``'s.
"""

from __future__ import annotations

from serving_core.stream.kafka.config import check
from serving_core.stream.kafka.sink import KafkaSink
from serving_core.stream.kafka.source import KafkaSource


def check_source(url: str) -> None:
    check(url, "a Kafka source")


def check_sink(url: str) -> None:
    check(url, "a Kafka sink")


def open_source(url: str, batch_size: int, consumer: str) -> KafkaSource:
    return KafkaSource(url, batch_size=batch_size, consumer=consumer)


def open_sink(url: str) -> KafkaSink:
    return KafkaSink(url)
