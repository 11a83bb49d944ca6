"""``serving-core stream`` end to end: the real process over a real broker.

Every test runs over each broker of conftest's ``BROKERS`` (the ``broker``
fixture): the same messages, the same handler, the same expectations, whatever
the source and the sinks are. A gated message (``gate``: a file path) holds its batch
until the test creates that file, and says it was taken in ``GATE.taken``
(``PID BATCH_SIZE``): "mid-batch" is an event, never a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from tests.servers import ROOT, free_port, spawn, stop, wait_for
from tests.stream.amqp_broker import AmqpBroker
from tests.stream.conftest import Broker
from tests.stream.redis_broker import Item, RedisBroker

POLL_TIMEOUT_S = 60.0  # a bound on waiting for an event, never an expected time

HANDLER = """
import os
import time
from pathlib import Path

from serving_core import Handler


class Doubler(Handler):
    name = "doubler"
    input_schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "poison": {"type": "boolean"},
            "gate": {"type": "string"},
            "pad": {"type": "integer"},
            "kill": {"type": "boolean"},
        },
        "required": ["n"],
    }

    def predict_batch(self, items):
        if any(item.get("kill") for item in items):
            os._exit(9)  # as a segfault or the OOM killer would
        if any(item.get("poison") for item in items):
            raise RuntimeError("poisoned batch")
        for item in items:
            if "gate" in item:
                gate = Path(item["gate"])
                taken = gate.with_name(gate.name + ".taken")
                taken.write_text(f"{os.getpid()} {len(items)}")
                while not gate.exists():
                    time.sleep(0.01)
        return [
            {"double": 2 * item["n"], "pid": os.getpid(), "pad": "x" * item.get("pad", 0)}
            for item in items
        ]
"""


@contextlib.contextmanager
def stream_worker(
    broker: Broker, tmp: Path, **overrides: str
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``serving-core stream`` over ``broker``; yields (process, health URL, log) once healthy."""
    handler = tmp / "handler.py"
    handler.write_text(HANDLER)
    port = free_port()
    env = {
        "SERVING_HANDLER": str(handler),
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_METRICS_DIR": str(tmp / f"metrics-{port}"),
        "SERVING_STREAM_SOURCE": broker.source_url,
        "SERVING_STREAM_SINK": broker.sink_url,
        "SERVING_STREAM_DEAD_LETTER": broker.dead_url,
        "SERVING_WORKERS": "1",
        "SERVING_MAX_BATCH_SIZE": "8",
        "SERVING_GRACEFUL_TIMEOUT_S": "60",
        **overrides,
    }
    log_path = tmp / f"stream-{port}.log"
    process = spawn("stream", env, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: process.poll() is not None or _healthy(url),
            lambda: f"a healthy stream worker:\n{log_path.read_text()}",
            POLL_TIMEOUT_S,
        )
        assert process.poll() is None, log_path.read_text()
        yield process, url, log_path
    finally:
        stop(process)


def results_at_least(broker: Broker, count: int) -> Callable[[], bool]:
    """A condition for ``wait_for``, read at most every 0.2 s: it reads every result."""
    last = [0.0]

    def enough() -> bool:
        if time.monotonic() - last[0] < 0.2:
            return False
        last[0] = time.monotonic()
        return len(broker.results()) >= count

    return enough


def _healthy(url: str) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(url + "/healthz", timeout=1).status_code == 200
    return False


def metric(url: str, name: str, labels: str = "") -> float:
    """The sum of ``name``'s samples (those whose labels hold ``labels``) on /metrics."""
    total = 0.0
    for line in requests.get(url + "/metrics", timeout=5).text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample.split("{")[0] == name and labels in sample:
            total += float(value)
    return total


def numbers(count: int, start: int = 0) -> list[Item]:
    return [
        (f"m-{i}", json.dumps({"n": i}).encode(), {"trace": f"t-{i}"})
        for i in range(start, start + count)
    ]


def gated(gate: Path, n: int) -> Item:
    return (f"m-{n}", json.dumps({"n": n, "gate": str(gate)}).encode(), {"trace": f"t-{n}"})


def taken(gate: Path) -> tuple[int, int]:
    """(pid, batch size) of the consumer that holds the gated message, once it does."""
    marker = gate.with_name(gate.name + ".taken")
    text = wait_for(lambda: marker.exists() and marker.read_text(), "the gated batch")
    pid, size = text.split()
    return int(pid), int(size)


def by_id(items: list[Item]) -> dict[str, list[dict[str, Any]]]:
    seen: dict[str, list[dict[str, Any]]] = {}
    for message_id, body, headers in items:
        seen.setdefault(message_id, []).append({"body": json.loads(body), "headers": headers})
    return seen


def test_5000_messages_each_give_one_result_per_delivery_with_their_ids_and_headers(
    broker: Broker, tmp_path: Path
) -> None:
    broker.produce(numbers(5000))
    with stream_worker(broker, tmp_path, SERVING_WORKERS="2", SERVING_MAX_BATCH_SIZE="32") as (
        _,
        url,
        _log,
    ):
        wait_for(results_at_least(broker, 5000), "5,000 results", POLL_TIMEOUT_S)
        wait_for(lambda: broker.lag() == 0, "every message acked")
        consumed = metric(url, "serving_stream_consumed_total")
        published = metric(url, "serving_stream_published_total")
        health = requests.get(url + "/healthz", timeout=5).json()
    results = broker.results()
    seen = by_id(results)
    assert set(seen) == {f"m-{i}" for i in range(5000)}
    # One result per delivery: more than one only where the broker delivered again.
    assert len(results) == consumed == published
    for i in range(5000):
        for result in seen[f"m-{i}"]:
            assert result["body"]["double"] == 2 * i
            assert result["headers"] == {"trace": f"t-{i}"}
    assert broker.dead() == []
    assert health["consumers"] == 2


def test_a_consumer_killed_mid_batch_loses_nothing_and_its_batch_runs_again(
    broker: Broker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    broker.produce([gated(gate, 0), *numbers(7, start=1)], one_batch=True)
    with stream_worker(broker, tmp_path) as (process, url, log_path):
        killed, size = taken(gate)
        assert size == 8  # the whole batch was in hand
        os.kill(killed, signal.SIGKILL)
        gate.touch()
        # Over Kafka, once the killed consumer's session has timed out (6 s here).
        wait_for(
            lambda: len(broker.results()) >= 8,
            lambda: f"8 results:\n{log_path.read_text()}",
            POLL_TIMEOUT_S,
        )
        wait_for(lambda: broker.lag() == 0, "the batch acked")
        redelivered = metric(url, "serving_stream_redelivered_total")
        assert process.poll() is None
    seen = by_id(broker.results())
    assert set(seen) == {f"m-{i}" for i in range(8)}
    # The killed consumer published nothing; its respawned successor ran every message.
    pids = {result["body"]["pid"] for results in seen.values() for result in results}
    assert killed not in pids
    # Kafka keeps no delivery count: its redelivery is a first delivery to the successor.
    assert redelivered == (8 if broker.counts_deliveries else 0)


def test_a_restarted_broker_is_reconnected_to_and_nothing_is_lost(
    broker: Broker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    broker.produce([gated(gate, 0), *numbers(299, start=1)])
    with stream_worker(broker, tmp_path, SERVING_WORKERS="2") as (process, url, log_path):
        consumers = requests.get(url + "/healthz", timeout=5).json()["pids"]
        holder, _ = taken(gate)
        # One consumer holds its gated batch unacked, over AMQP up to two batches more
        # (prefetch is three times the batch size), over Kafka its partitions' messages
        # (half of them, with two consumers over four partitions); the other works off
        # the rest.
        wait_for(results_at_least(broker, 100), "the ungated messages' results")
        broker.restart()
        gate.touch()  # the holder publishes to a broker that is gone, or back
        broker.produce(numbers(300, start=300))
        wait_for(
            lambda: len(by_id(broker.results())) >= 600,
            lambda: f"600 results:\n{log_path.read_text()}",
            POLL_TIMEOUT_S,
        )
        wait_for(lambda: broker.lag() == 0, "every message acked")
        reconnects = metric(url, "serving_stream_reconnects_total")
        after = requests.get(url + "/healthz", timeout=5).json()["pids"]
        assert process.poll() is None
    assert set(by_id(broker.results())) == {f"m-{i}" for i in range(600)}
    if broker.client_reconnects:  # librdkafka reconnects by itself: the ends stay open
        assert "Connection refused" in log_path.read_text()
    else:
        assert reconnects >= 1
    assert after == consumers  # reconnected in place: no consumer died, none was forked
    assert holder in consumers
    assert "exited" not in log_path.read_text()


def test_poison_and_invalid_messages_are_dead_lettered_with_their_errors_and_the_rest_flows(
    broker: Broker, tmp_path: Path
) -> None:
    poison = b'{"n": 100, "poison": true}'
    broker.produce(
        [
            *numbers(3),
            ("poison", poison, {"trace": "p"}),
            ("not-json", b"{nope", {"trace": "j"}),
            ("invalid", b'{"n": "seven"}', {"trace": "i"}),
            *numbers(2, start=3),
        ]
    )
    with stream_worker(broker, tmp_path, SERVING_STREAM_MAX_ATTEMPTS="3") as (_, url, _log):
        wait_for(lambda: len(broker.dead()) >= 3, "3 dead letters")
        broker.produce(numbers(5, start=5))
        wait_for(lambda: len(broker.results()) >= 10, "the others' results")
        wait_for(lambda: broker.lag() == 0, "every message acked")
        dead_counts = {
            reason: metric(url, "serving_stream_dead_lettered_total", f'reason="{reason}"')
            for reason in ("invalid", "failed")
        }
    assert set(by_id(broker.results())) == {f"m-{i}" for i in range(10)}
    dead = {message_id: (json.loads(body), headers) for message_id, body, headers in broker.dead()}
    assert set(dead) == {"poison", "not-json", "invalid"}
    letter, headers = dead["poison"]
    assert letter["attempts"] == 3  # the batch once, then alone twice
    assert letter["input"] == poison.decode()
    # The model's exception stays in the worker's log, under the message's id.
    assert letter["error"]["type"] == "model_error"
    assert "request id poison" in letter["error"]["message"]
    assert headers == {"trace": "p", "error": "model_error"}
    assert dead["not-json"][0]["error"]["type"] == "invalid_json"
    assert dead["not-json"][0]["input"] == "{nope"
    assert dead["not-json"][0]["attempts"] == 0
    assert "n" in dead["invalid"][0]["error"]["message"]
    assert dead["invalid"][0]["attempts"] == 1
    assert dead_counts == {"invalid": 2, "failed": 1}


def test_sigterm_finishes_the_batch_in_hand_then_the_worker_exits(
    broker: Broker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    broker.produce([gated(gate, 0), *numbers(7, start=1)], one_batch=True)
    with stream_worker(broker, tmp_path) as (process, _url, log_path):
        _, size = taken(gate)
        assert size == 8
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: "stopping" in log_path.read_text(), "the master's stop")
        assert broker.results() == []  # still in hand
        gate.touch()
        assert process.wait(POLL_TIMEOUT_S) == 0
    assert set(by_id(broker.results())) == {f"m-{i}" for i in range(8)}
    assert broker.lag() == 0  # published, then acked


@pytest.mark.e2e
@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_the_stream_master_fetches_the_model_before_preload(broker: Broker, tmp_path: Path) -> None:
    """SERVING_MODEL_URI under ``serving-core stream``: the consumers' handler reads the
    folder it names (tests/commands/test_model_uri.py has the other commands)."""
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "weights.txt").write_text("the weights")
    artifacts = ROOT / "tests" / "handlers" / "artifacts" / "handler.py"
    broker.produce([("m-0", b"{}", {})])
    with stream_worker(
        broker, tmp_path, SERVING_HANDLER=str(artifacts), SERVING_MODEL_URI=str(weights)
    ) as (_, url, _log):
        wait_for(results_at_least(broker, 1), "the result", POLL_TIMEOUT_S)
        info = metric(url, "serving_model_info", 'revision="sha256:')
    ((_, body, _),) = broker.results()
    assert json.loads(body)["weights"] == "the weights"
    assert info == 1


@contextlib.contextmanager
def low_size_limit(broker: Broker) -> Iterator[tuple[int, dict[str, str]]]:
    """The broker's message-size limit set as low as it goes: (the limit in bytes, the
    stream worker's settings for it)."""
    if isinstance(broker, RedisBroker):
        client = redis.Redis.from_url(broker.sink_url.partition("?")[0])
        client.config_set("proto-max-bulk-len", "1mb")  # its least
        yield 1024 * 1024, {}
        client.close()
    elif isinstance(broker, AmqpBroker):
        # Read by each channel as it opens: the worker's open after this.
        broker.server.eval("application:set_env(rabbit, max_message_size, 4096).")
        try:
            yield 4096, {}
        finally:
            broker.server.eval("application:unset_env(rabbit, max_message_size).")
    else:  # Kafka: librdkafka's own limit, which the broker's would give the same way
        yield (
            4096,
            {
                "SERVING_STREAM_SINK": broker.sink_url + "?message.max.bytes=4096",
                "SERVING_STREAM_DEAD_LETTER": broker.dead_url + "?message.max.bytes=4096",
            },
        )


def test_h3_what_the_broker_refuses_to_publish_ends_as_a_dead_letter_and_is_acked(
    broker: Broker, tmp_path: Path
) -> None:
    """H3: a result or dead letter the broker refused (too large) left its message unacked:
    delivered again for ever, the queue behind it blocked. A refused result becomes a
    dead letter; a refused dead letter (its input escaped, up to 6 times its size) is
    published with its input cut short; both are acked, never handed out again."""
    with low_size_limit(broker) as (limit, env):
        big_result = {"n": 1, "pad": limit + 100}
        # Not JSON: its dead letter holds it escaped, each byte as \u0001.
        big_letter = b"\x01" * (limit // 5)
        broker.produce(
            [
                *numbers(2),
                ("big-result", json.dumps(big_result).encode(), {"trace": "r"}),
                ("big-letter", big_letter, {"trace": "l"}),
                *numbers(2, start=2),
            ]
        )
        with stream_worker(broker, tmp_path, **env) as (_, url, log_path):
            wait_for(
                lambda: len(broker.dead()) >= 2,
                lambda: f"2 dead letters:\n{log_path.read_text()}",
                POLL_TIMEOUT_S,
            )
            wait_for(results_at_least(broker, 4), "the others' results", POLL_TIMEOUT_S)
            wait_for(lambda: broker.lag() == 0, "every message acked", POLL_TIMEOUT_S)
            refused = metric(url, "serving_stream_dead_lettered_total", 'reason="refused"')
            redelivered = metric(url, "serving_stream_redelivered_total")
            published = metric(url, "serving_stream_published_total")
    assert set(by_id(broker.results())) == {f"m-{i}" for i in range(4)}
    dead = {message_id: (json.loads(body), headers) for message_id, body, headers in broker.dead()}
    assert set(dead) == {"big-result", "big-letter"}
    letter, headers = dead["big-result"]
    assert letter["error"]["type"] == "result_refused"
    assert json.loads(letter["input"]) == big_result
    assert headers["trace"] == "r"
    letter, headers = dead["big-letter"]
    assert letter["error"]["type"] == "invalid_json"
    assert "the whole dead letter was refused too" in letter["error"]["message"]
    assert letter["input"] == "\x01" * 256
    assert (letter["input_truncated"], letter["input_bytes"]) == (True, len(big_letter))
    assert headers["trace"] == "l"
    assert (refused, published, redelivered) == (1, 4, 0)


@pytest.mark.e2e
@pytest.mark.parametrize("broker", ["redis", "amqp"], indirect=True)
def test_m2_a_message_that_kills_its_consumer_is_the_only_one_dead_lettered(
    broker: Broker, tmp_path: Path
) -> None:
    """M2: a message that killed its consumer took its batch-mates into the dead letters
    as attempts_exhausted (handed out as often as it was), some after their results
    had been published. Kafka keeps no delivery count: it hands the batch out again
    as new, so there the killer is run again until one consumer survives it
    (docs/streams.md)."""
    killer = ("killer", b'{"n": 100, "kill": true}', {"trace": "k"})
    broker.produce([*numbers(3), killer, *numbers(4, start=3)], one_batch=True)
    with stream_worker(broker, tmp_path, SERVING_STREAM_MAX_ATTEMPTS="3") as (
        process,
        url,
        log_path,
    ):
        wait_for(
            lambda: len(broker.dead()) >= 1,
            lambda: f"the killer's dead letter:\n{log_path.read_text()}",
            POLL_TIMEOUT_S,
        )
        wait_for(results_at_least(broker, 7), "the others' results", POLL_TIMEOUT_S)
        wait_for(lambda: broker.lag() == 0, "every message acked", POLL_TIMEOUT_S)
        exhausted = metric(url, "serving_stream_dead_lettered_total", 'reason="exhausted"')
        assert process.poll() is None
    ((message_id, body, _),) = broker.dead()
    letter = json.loads(body)
    assert (message_id, letter["error"]["type"], letter["attempts"]) == (
        "killer",
        "attempts_exhausted",
        3,
    )
    seen = by_id(broker.results())
    assert set(seen) == {f"m-{i}" for i in range(7)}
    # Each batch-mate's result once: none was published before the killer was found.
    assert {message_id: len(results) for message_id, results in seen.items()} == {
        f"m-{i}": 1 for i in range(7)
    }
    assert exhausted == 1
