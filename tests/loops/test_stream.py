"""A stream consumer's decisions on one batch: what runs, what is retried, what is a dead
letter (``StreamLoop.run_batch``, over a real ``Engine``; the brokers are in
tests/stream)."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from serving_core import Handler
from serving_core.engine.engine import Engine
from serving_core.loops.inflight import Ends
from serving_core.loops.stream import StreamLoop
from serving_core.loops.suspects import Suspects
from serving_core.metrics.stream import StreamMetrics
from serving_core.stream.base import BrokerError, Message, Refused
from tests.loops.flaky import Flaky


def loop(handler: Handler, suspects: Suspects | None = None) -> StreamLoop:
    def no_ends() -> Ends:
        raise AssertionError("run_batch opens no broker")

    return StreamLoop(
        Engine(handler, max_batch_size=8),
        no_ends,
        max_batch_size=8,
        max_attempts=3,
        stopping=lambda: False,
        metrics=StreamMetrics(),
        suspects=suspects or Suspects(),
    )


def message(message_id: str, params: Any, deliveries: int = 1) -> Message:
    body = params if isinstance(params, bytes) else json.dumps(params).encode()
    return Message(message_id, body, {"h": message_id}, deliveries, message_id)


def test_a_model_failure_is_run_again_alone_and_succeeds_without_its_batch_mates() -> None:
    handler = Flaky()
    batch = loop(handler).run_batch(
        [message("a", {"n": 1}), message("b", {"n": 2, "flaky": True}), message("c", {"n": 3})]
    )
    assert [(r.id, json.loads(r.body), r.headers) for r in batch.results] == [
        ("a", {"double": 2}, {"h": "a"}),
        ("b", {"double": 4}, {"h": "b"}),
        ("c", {"double": 6}, {"h": "c"}),
    ]
    assert batch.dead == []
    assert handler.batches == [[1, 2, 3], [1], [2], [3]]


def test_a_poison_message_runs_max_attempts_times_then_is_a_dead_letter() -> None:
    handler = Flaky()
    batch = loop(handler).run_batch(
        [message("ok", {"n": 1}), message("poison", {"n": 9, "poison": True})]
    )
    assert [r.id for r in batch.results] == ["ok"]
    (dead,) = batch.dead
    letter = json.loads(dead.body)
    assert (dead.id, dead.headers, letter["attempts"]) == (
        "poison",
        {"h": "poison", "error": "model_error"},
        3,
    )
    assert letter["error"]["type"] == "model_error"
    assert json.loads(letter["input"]) == {"n": 9, "poison": True}
    assert handler.batches == [[1, 9], [1], [9], [9]]  # each alone: "ok" succeeds at once
    assert batch.reasons == {"failed": 1}


def test_m2_messages_handed_out_again_run_alone_and_only_the_killer_is_dead_lettered() -> None:
    """M2: a message that killed its consumer took its batch-mates into the dead letters
    (all of them handed out as often). Each message handed out again runs alone,
    counted while it runs: only the one whose consumers died running it is dead."""
    handler = Flaky()
    suspects = Suspects()
    killer = message("killer", {"n": 9}, deliveries=4)
    for _ in range(2):  # two consumers died running it alone (``running``, never ``done``)
        suspects.running(killer)
    runner = loop(handler, suspects)
    batch = runner.run_batch(
        [message("a", {"n": 1}, deliveries=4), killer, message("b", {"n": 2}, deliveries=4)]
    )
    assert handler.batches == [[1], [2]]  # each alone
    assert [r.id for r in batch.results] == ["a", "b"]
    (dead,) = batch.dead
    letter = json.loads(dead.body)
    assert (dead.id, letter["error"]["type"], letter["attempts"]) == (
        "killer",
        "attempts_exhausted",
        3,
    )
    assert "SERVING_STREAM_MAX_ATTEMPTS=3" in letter["error"]["message"]
    assert batch.reasons == {"exhausted": 1}
    # Those that ran are forgotten: handed out again, they would run again.
    assert suspects.deaths(message("a", {"n": 1})) == 0
    assert suspects.deaths(killer) == 0


def test_a_message_handed_out_more_than_four_times_max_attempts_is_dead_lettered_unrun() -> None:
    """Whatever this host counted (its consumers die on other hosts, say)."""
    handler = Flaky()
    batch = loop(handler).run_batch([message("crashy", {"n": 5}, deliveries=13)])
    (dead,) = batch.dead
    letter = json.loads(dead.body)
    assert letter["error"]["type"] == "attempts_exhausted"
    assert "handed out 13 times" in letter["error"]["message"]
    assert handler.batches == []


def test_suspects_in_a_directory_outlive_the_process_that_counted_them(tmp_path: Any) -> None:
    killer = message("killer", {"n": 9}, deliveries=2)
    Suspects(str(tmp_path)).running(killer)  # its consumer died: nothing undid it
    again = Suspects(str(tmp_path))
    assert again.deaths(killer) == 1
    assert again.deaths(message("killer", {"n": 8})) == 0  # another body, another message
    again.done(killer)
    assert list(tmp_path.iterdir()) == []


def test_bodies_that_are_not_a_json_object_are_dead_letters_and_never_run() -> None:
    handler = Flaky()
    batch = loop(handler).run_batch(
        [message("text", b"hello"), message("list", [1, 2]), message("ok", {"n": 1})]
    )
    kinds = {d.id: json.loads(d.body)["error"]["type"] for d in batch.dead}
    assert kinds == {"text": "invalid_json", "list": "invalid_json"}
    assert json.loads(batch.dead[0].body)["input"] == "hello"
    assert handler.batches == [[1]]


def test_a_message_without_an_id_is_dead_lettered_unrun_saying_to_set_message_id() -> None:
    handler = Flaky()
    batch = loop(handler).run_batch([message("", {"n": 1}), message("b", {"n": 2})])
    assert handler.batches == [[2]]
    assert [r.id for r in batch.results] == ["b"]
    (dead,) = batch.dead
    error = json.loads(dead.body)["error"]
    assert error["type"] == "missing_id"
    assert "message_id" in error["message"]
    assert batch.reasons == {"invalid": 1}


class Log:
    """The ends' calls and the handler's runs, in order (a queue in memory: the
    order is what these tests check; tests/stream runs the real brokers)."""

    def __init__(self, batches: list[list[Message]]) -> None:
        self.waiting = list(batches)
        self.events: list[str] = []
        self.waits: list[float] = []
        self.acked: defaultdict[str, threading.Event] = defaultdict(threading.Event)


class ListSource:
    def __init__(self, log: Log) -> None:
        self.log = log

    def take(self, max_n: int, wait_s: float) -> list[Message]:
        self.log.waits.append(wait_s)
        return self.log.waiting.pop(0) if self.log.waiting else []

    def ack(self, messages: Any) -> None:
        self.log.events.append("ack " + ",".join(m.id for m in messages))
        for m in messages:
            self.log.acked[m.id].set()

    def lag(self) -> int | None:
        return None

    def close(self) -> None:
        pass


class ListSink:
    def __init__(self, log: Log, name: str) -> None:
        self.log, self.name = log, name

    def send(self, messages: Any) -> None:
        self.log.events.append(f"send {self.name} " + ",".join(m.id for m in messages))

    def confirm(self) -> None:
        self.log.events.append(f"confirm {self.name}")

    def publish(self, messages: Any) -> None:
        self.send(messages)
        self.confirm()

    def close(self) -> None:
        pass


class Recorder(Handler):
    name = "recorder"

    def __init__(self, log: Log) -> None:
        self.log = log

    def predict_batch(self, items: list[Any]) -> list[Any]:
        self.log.events.append("run " + ",".join(str(item["n"]) for item in items))
        return [{"n": item["n"]} for item in items]


class Overlapped(Recorder):
    """Runs item 2 only once message ``a`` is acked: a loop that settled the batch
    before only after the model ran the next would wait here, and is told so."""

    def predict_batch(self, items: list[Any]) -> list[Any]:
        if items[0]["n"] == 2 and not self.log.acked["a"].wait(10):
            self.log.events.append("a was still unacked after 10 s of the next batch's run")
        return super().predict_batch(items)


def run(log: Log, stopping: Callable[[], bool], handler: Handler | None = None) -> None:
    """A consumer over ``log``'s batches, until ``stopping``."""
    StreamLoop(
        Engine(handler or Recorder(log), max_batch_size=8),
        lambda: Ends(ListSource(log), ListSink(log, "out"), ListSink(log, "dead")),
        max_batch_size=8,
        max_attempts=3,
        stopping=stopping,
        metrics=StreamMetrics(),
    ).run()


def test_a_batch_is_sent_as_the_next_starts_and_confirmed_and_acked_while_it_runs() -> None:
    log = Log([[message("a", {"n": 1})], [message("b", {"n": 2})]])
    # Until every batch was taken and a take then waited for more (idle).
    run(log, lambda: not log.waiting and len(log.waits) > 0 and log.waits[-1] > 0, Overlapped(log))
    assert log.events == [
        "run 1",
        "send out a",  # b was taken while 1 ran, and is on the model thread now
        "send dead ",
        "confirm out",
        "confirm dead",
        "ack a",
        "run 2",  # a was confirmed and acked while b ran (Overlapped)
        "send out b",
        "send dead ",
        "confirm out",  # nothing more came: b is confirmed at once
        "confirm dead",
        "ack b",
    ]
    # The first take waits; with a batch running or awaiting its confirms, a take
    # takes what is there and does not wait for more.
    assert log.waits == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_a_stop_confirms_and_acks_the_batch_in_hand_before_the_consumer_returns() -> None:
    log = Log([[message("a", {"n": 1})]])
    run(log, lambda: any(e.startswith("run") for e in log.events))
    assert log.events[-3:] == ["confirm out", "confirm dead", "ack a"]


class Limited(ListSink):
    """A sink whose broker refuses a message over ``limit`` bytes, as Redis' or
    RabbitMQ's size limits do (tests/stream has the real ones)."""

    def __init__(self, log: Log, name: str, limit: int) -> None:
        super().__init__(log, name)
        self.limit = limit
        self.sent: list[Any] = []
        self.kept: list[Any] = []

    def send(self, messages: Any) -> None:
        super().send(messages)
        self.sent += messages

    def confirm(self) -> None:
        super().confirm()
        sent, self.sent = self.sent, []
        refused = [m for m in sent if len(m.body) > self.limit]
        self.kept += [m for m in sent if len(m.body) <= self.limit]
        if refused:
            raise Refused(f"over {self.limit} bytes", refused)


class Echo(Handler):
    name = "echo"

    def predict_batch(self, items: list[Any]) -> list[Any]:
        return [{"pad": "x" * item["pad"]} for item in items]


def test_h3_a_message_whose_result_and_dead_letters_are_all_refused_is_logged_and_acked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """H3: even a dead letter cut short can be refused (a limit below it): the message is
    acked all the same, its end in the log, never delivered again."""
    log = Log([[message("ok", {"pad": 1}), message("huge", {"pad": 500})]])
    out, dead = Limited(log, "out", 100), Limited(log, "dead", 10)
    StreamLoop(
        Engine(Echo(), max_batch_size=8),
        lambda: Ends(ListSource(log), out, dead),
        max_batch_size=8,
        max_attempts=3,
        # Or a bound, where it would go round for ever.
        stopping=lambda: any(e.startswith("ack") for e in log.events) or len(log.waits) > 100,
        metrics=StreamMetrics(),
    ).run()
    assert [m.id for m in out.kept] == ["ok"]
    assert dead.kept == []
    assert log.events[-1] == "ack ok,huge"
    assert "'huge': the broker refused its result and its dead letter" in caplog.text


def test_h3_a_broker_that_takes_but_never_confirms_is_reconnected_to_with_growing_pauses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """H3: the back-off started again at every take that worked, so a broker that hands
    messages out but fails every publish was reconnected to every ~0.3 s for ever. It
    starts again only once a batch is acked."""

    class Failing(ListSink):
        def confirm(self) -> None:
            raise BrokerError("unroutable")

    class Redelivering(ListSource):
        def take(self, max_n: int, wait_s: float) -> list[Message]:
            return [message("again", {"n": 1}, deliveries=2)]

    log = Log([])
    opened: list[int] = []

    def ends() -> Ends:
        opened.append(1)
        return Ends(Redelivering(log), Failing(log, "out"), ListSink(log, "dead"))

    caplog.set_level(logging.WARNING, "serving_core.loops.stream")
    StreamLoop(
        Engine(Recorder(log), max_batch_size=8),
        ends,
        max_batch_size=8,
        max_attempts=3,
        stopping=lambda: len(opened) > 3,
        metrics=StreamMetrics(),
    ).run()
    pauses = [float(p) for p in re.findall(r"reconnecting in ([0-9.]+) s", caplog.text)]
    assert len(pauses) == 3
    # Full jitter over a doubling ceiling: the third is at least half of 2.0 s.
    assert pauses[2] >= 1.0


def test_a_message_without_a_body_is_dead_lettered_saying_the_body_is_missing() -> None:
    """New user's walk: a Redis entry with no ``body`` field was dead-lettered as "the
    message body is not JSON"."""
    handler = Flaky()
    batch = loop(handler).run_batch([message("empty", b""), message("ok", {"n": 1})])
    (dead,) = batch.dead
    error = json.loads(dead.body)["error"]
    assert error["type"] == "missing_body"
    assert "'body' field" in error["message"]
    assert "not JSON" not in error["message"]
    assert handler.batches == [[1]]
