"""Kafka's own guarantees, end to end: ``serving-core stream`` processes over a real
Kafka-protocol broker (tests/stream/kafka_broker.py), beyond what every broker
shows in test_stream_worker.py: keys and partition order, the source offset on
each result, rebalances when a consumer joins, the lag per partition."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.servers import wait_for
from tests.stream.kafka_broker import KafkaBroker, Record
from tests.stream.redis_broker import Item
from tests.stream.test_stream_worker import (
    POLL_TIMEOUT_S,
    gated,
    metric,
    numbers,
    stream_worker,
    taken,
)

pytestmark = pytest.mark.e2e
KEYS = 13  # keys over 4 partitions: several keys share each one


@pytest.fixture
def kafka(s3: str) -> Iterator[KafkaBroker]:
    with KafkaBroker(s3) as broker:
        yield broker


def keyed(count: int, start: int = 0) -> tuple[list[Item], list[bytes]]:
    items = numbers(count, start)
    return items, [f"k{i % KEYS}".encode() for i in range(start, start + count)]


def results_for(kafka: KafkaBroker, count: int) -> list[Record]:
    wait_for(
        lambda: len({r.id for r in kafka.records("out")}) >= count,
        f"{count} results",
        POLL_TIMEOUT_S,
    )
    return kafka.records("out")


def test_5000_keyed_messages_over_4_partitions_and_2_consumers_keep_key_order_and_origin(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    items, keys = keyed(5000)
    kafka.produce(items, keys=keys)
    with stream_worker(kafka, tmp_path, SERVING_WORKERS="2", SERVING_MAX_BATCH_SIZE="32") as (
        _,
        url,
        _log,
    ):
        records = results_for(kafka, 5000)
        wait_for(lambda: kafka.lag() == 0, "every offset committed")
        consumed = metric(url, "serving_stream_consumed_total")
    assert len(records) == consumed  # one result per delivery
    assert {r.id for r in records} == {f"m-{i}" for i in range(5000)}
    pids = set()
    for record in records:
        n = int(record.id.removeprefix("m-"))
        body = json.loads(record.body)
        pids.add(body["pid"])
        assert body["double"] == 2 * n
        assert record.key == keys[n]
        assert record.headers == {"trace": f"t-{n}"}
        partition, offset = kafka.produced[record.id]
        assert record.origin == f"in/{partition}/{offset}"
    assert len(pids) == 2  # both consumers had partitions
    # Per key, the results come in the inputs' order: one key, one partition each way.
    for key in {r.key for r in records}:
        ofkey = [r for r in records if r.key == key]
        assert len({r.partition for r in ofkey}) == 1
        origins = [int(r.origin.rsplit("/", 1)[1]) for r in ofkey]
        assert origins == sorted(origins)


def test_a_consumer_that_joins_mid_run_takes_partitions_and_no_committed_offset_runs_twice(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    items, keys = keyed(3000)
    kafka.produce(items, keys=keys)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with stream_worker(kafka, tmp_path / "a", SERVING_MAX_BATCH_SIZE="16") as (_, _url, log_a):
        wait_for(lambda: len(kafka.records("out")) >= 300, "the first consumer's results")
        with stream_worker(kafka, tmp_path / "b", SERVING_MAX_BATCH_SIZE="16") as (
            _,
            url_b,
            log_b,
        ):
            records = results_for(kafka, 3000)
            wait_for(lambda: kafka.lag() == 0, "every offset committed")
            joined = metric(url_b, "serving_stream_consumed_total")
    assert {r.id for r in records} == {f"m-{i}" for i in range(3000)}
    assert joined > 0, log_b.read_text()  # the rebalance gave the joiner partitions
    # Incremental (cooperative) rebalancing: the first consumer gave up only the
    # partitions that moved, and went on with the others.
    given_up = [
        line.rpartition("revoked partitions ")[2].split(", ")
        for line in log_a.read_text().splitlines()
        if "revoked partitions" in line
    ]
    assert given_up, log_a.read_text()
    assert all(0 < len(partitions) < 4 for partitions in given_up[:-1]), given_up
    moved = len(given_up[0])
    # A result twice only for an input whose offset the first owner had not committed
    # when its partition moved: at most the batch it was running and the one whose
    # results awaited their confirms, per partition it gave up.
    copies: dict[str, list[int]] = {}
    for record in records:
        copies.setdefault(record.origin, []).append(json.loads(record.body)["pid"])
    twice = {origin: pids for origin, pids in copies.items() if len(pids) > 1}
    assert all(len(pids) == 2 and pids[0] != pids[1] for pids in twice.values()), twice
    assert len(twice) <= 2 * 16 * moved


def test_the_lag_of_each_partition_is_on_metrics_while_a_batch_is_held(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    kafka.produce([gated(gate, 0), *numbers(19, start=1)], one_batch=True)
    with stream_worker(kafka, tmp_path) as (_, url, _log):
        taken(gate)
        partition, _ = kafka.produced["m-0"]
        label = f'partition="in/{partition}"'
        # Not yet acked: the whole partition waits (the held batch and those behind it).
        wait_for(lambda: metric(url, "serving_stream_partition_lag", label) == 20, "lag 20")
        gate.touch()
        wait_for(lambda: len(kafka.records("out")) >= 20, "20 results")
        wait_for(lambda: metric(url, "serving_stream_partition_lag", label) == 0, "lag 0")
        text = requests.get(url + "/metrics", timeout=5).text
    assert "serving_stream_partition_lag" in text
