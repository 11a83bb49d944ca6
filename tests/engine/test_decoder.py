"""The decoder: continuous batching of a generating handler's steps, shown by the
handler's own record of its steps."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from serving_core import Final, Generation, Handler, InvalidInput
from serving_core.context import Context
from serving_core.engine.decoder import Decoder
from serving_core.engine.engine import Engine
from serving_core.engine.stepper import Chunk, End, Event, Stepper
from serving_core.engine.ticket import Ticket
from serving_core.engine.watchdog import Verdict, Watchdog
from serving_core.errors import DeadlineExceeded, InvalidParams, ModelError, NotReady, Overloaded

WAIT_S = 30.0


class Counting(Handler):
    """Each generation counts from 0 to its item's ``n``; every step's members recorded.
    ``hold`` (when cleared) stops each step at its start until set."""

    def __init__(self) -> None:
        self.steps: list[list[str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.stepping = threading.Event()

    def step(self, generations: list[Generation]) -> list[Any]:
        self.steps.append([g.context.request_id for g in generations])
        self.stepping.set()
        assert self.hold.wait(WAIT_S)
        answers: list[Any] = []
        for g in generations:
            if g.item.get("bad_at") == g.steps:
                answers.append(InvalidInput("a bad token"))
                continue
            if g.item.get("fail_at") == g.steps:
                raise RuntimeError("the model broke")
            chunk = {"text": f"{g.steps} "}
            answers.append(Final(chunk) if g.steps + 1 >= g.item["n"] else chunk)
        return answers

    def steps_of(self, request_id: str) -> list[int]:
        return [i for i, members in enumerate(self.steps) if request_id in members]


class Interleaved(Handler):
    def generate(self, item: Any) -> Iterator[dict[str, Any]]:
        for i in range(item["n"]):
            yield {"text": f"{item['name']}{i}"}


def decoder_for(handler: Handler, *, max_running: int = 4, max_queue: int = 8) -> Decoder:
    decoder = Decoder(Stepper(handler), max_running=max_running, max_queue=max_queue)
    decoder.start()
    return decoder


def open_one(decoder: Decoder, name: str, item: dict[str, Any], **kw: Any) -> Ticket:
    now = time.monotonic()
    ctx = Context(name, kw.pop("deadline", now + WAIT_S))
    return decoder.open(
        item, ctx, max_tokens=kw.pop("max_tokens", 100), arrival=now, ends_by=now + WAIT_S
    )


def events(ticket: Ticket) -> list[Event]:
    out: list[Event] = []
    while True:
        event = ticket.next(WAIT_S)
        assert event is not None, "no event within the wait"
        out.append(event)
        if not isinstance(event, Chunk):
            return out


def texts(got: list[Event]) -> str:
    return "".join(e.output["text"] for e in got if isinstance(e, Chunk))


def test_a_generation_streams_its_chunks_then_its_end() -> None:
    handler = Counting()
    decoder = decoder_for(handler)
    got = events(open_one(decoder, "a", {"n": 3}))
    assert texts(got) == "0 1 2 "
    assert got[-1] == End("stop")
    assert decoder.stop(WAIT_S)


def test_the_token_limit_ends_a_generation_with_length() -> None:
    decoder = decoder_for(Counting())
    got = events(open_one(decoder, "a", {"n": 50}, max_tokens=4))
    assert texts(got) == "0 1 2 3 "
    assert got[-1] == End("length")
    assert decoder.stop(WAIT_S)


def test_a_request_that_arrives_joins_the_running_batch_within_one_step() -> None:
    handler = Counting()
    decoder = decoder_for(handler)
    handler.hold.clear()
    long = open_one(decoder, "long", {"n": 40})
    assert handler.stepping.wait(WAIT_S)  # the long one's first step is in progress
    before = len(handler.steps)
    short = open_one(decoder, "short", {"n": 3})
    handler.hold.set()
    short_events = events(short)
    joined = handler.steps_of("short")[0]
    assert joined == before  # the very next step
    assert "long" in handler.steps[joined]  # it joined the running batch, not a batch of its own
    # The short one ended while the long one, which started earlier, still runs.
    assert short_events[-1] == End("stop")
    assert handler.steps_of("long")[-1] > handler.steps_of("short")[-1]
    long_events = events(long)
    assert long_events[-1] == End("stop")
    assert len(handler.steps_of("short")) == 3
    assert decoder.stop(WAIT_S)


def test_a_generation_leaves_at_once_when_it_ends_and_no_step_waits_for_the_longest() -> None:
    handler = Counting()
    decoder = decoder_for(handler)
    tickets = [open_one(decoder, name, {"n": n}) for name, n in (("a", 2), ("b", 6), ("c", 12))]
    for ticket in tickets:
        events(ticket)
    assert [len(handler.steps_of(name)) for name in "abc"] == [2, 6, 12]
    assert decoder.stop(WAIT_S)


def test_a_cancelled_generation_is_dropped_before_the_next_step() -> None:
    handler = Counting()
    decoder = decoder_for(handler)
    handler.hold.clear()
    ticket = open_one(decoder, "gone", {"n": 1000})
    assert handler.stepping.wait(WAIT_S)  # its first step is in progress
    stepped = len(handler.steps_of("gone"))
    ticket.cancel()
    handler.hold.set()
    other = open_one(decoder, "other", {"n": 3})
    events(other)
    # The step in progress when it let go was its last.
    assert len(handler.steps_of("gone")) == stepped
    assert decoder.stop(WAIT_S)


def test_a_bad_token_fails_its_own_generation_and_the_others_go_on() -> None:
    decoder = decoder_for(Counting())
    bad = open_one(decoder, "bad", {"n": 10, "bad_at": 2})
    good = open_one(decoder, "good", {"n": 5})
    bad_events = events(bad)
    assert texts(bad_events) == "0 1 "
    assert isinstance(bad_events[-1], InvalidParams)
    assert events(good)[-1] == End("stop")
    assert decoder.stop(WAIT_S)


def test_a_model_failure_mid_stream_is_each_generations_error_event() -> None:
    decoder = decoder_for(Counting())
    broken = open_one(decoder, "broken", {"n": 10, "fail_at": 3})
    got = events(broken)
    assert texts(got) == "0 1 2 "
    assert isinstance(got[-1], ModelError)
    assert "broken" in str(got[-1])  # the request id to look up in the log
    assert decoder.stop(WAIT_S)


def test_a_full_queue_is_refused_at_admission() -> None:
    handler = Counting()
    decoder = decoder_for(handler, max_running=1, max_queue=1)
    handler.hold.clear()
    open_one(decoder, "running", {"n": 5})
    assert handler.stepping.wait(WAIT_S)
    open_one(decoder, "waiting", {"n": 5})
    with pytest.raises(Overloaded) as refused:
        open_one(decoder, "refused", {"n": 5})
    assert refused.value.reason == "queue_full"
    handler.hold.set()
    assert decoder.stop(WAIT_S)


def test_a_generation_that_cannot_start_by_its_deadline_gets_a_deadline_error() -> None:
    handler = Counting()
    decoder = decoder_for(handler, max_running=1)
    handler.hold.clear()
    open_one(decoder, "running", {"n": 2})
    assert handler.stepping.wait(WAIT_S)
    late = open_one(decoder, "late", {"n": 2}, deadline=time.monotonic() + 0.05)
    time.sleep(0.1)  # its deadline passes while the one place is taken
    handler.hold.set()
    assert isinstance(events(late)[-1], DeadlineExceeded)
    assert decoder.stop(WAIT_S)


def test_the_simple_form_interleaves_the_generators_one_chunk_each() -> None:
    decoder = decoder_for(Interleaved())
    a = open_one(decoder, "a", {"n": 3, "name": "a"})
    b = open_one(decoder, "b", {"n": 2, "name": "b"})
    assert texts(events(a)) == "a0a1a2"
    assert texts(events(b)) == "b0b1"
    assert decoder.stop(WAIT_S)


def test_the_in_process_paths_collect_every_chunk_of_each_generation() -> None:
    engine = Engine(Counting(), max_batch_size=2, max_tokens=8)
    results = engine.predict_many(
        [{"n": 3}, {"n": 20}, {"n": 2, "max_tokens": 1}, {"n": 4, "max_tokens": 0}, {"n": 1}]
    )
    assert results[0] == {"text": "0 1 2 "}
    assert results[1] == {"text": "0 1 2 3 4 5 6 7 "}  # SERVING_MAX_TOKENS's 8
    assert results[2] == {"text": "0 "}
    assert isinstance(results[3], InvalidParams)
    assert results[4] == {"text": "0 "}


def test_the_in_process_paths_refuse_more_tokens_than_the_server_allows() -> None:
    engine = Engine(Counting(), max_batch_size=2, max_tokens=8)
    (result,) = engine.predict_many([{"n": 3, "max_tokens": 9}])
    assert isinstance(result, InvalidParams)
    assert "SERVING_MAX_TOKENS" in str(result)


class Ticking(Counting):
    """Each step takes one second of the test's clock."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    def step(self, generations: list[Generation]) -> list[Any]:
        self.clock[0] += 1.0
        return super().step(generations)


def test_admission_refuses_a_request_whose_first_token_is_predicted_late() -> None:
    now = [1000.0]
    handler = Ticking(now)
    decoder = Decoder(Stepper(handler), max_running=1, max_queue=8, clock=lambda: now[0])
    decoder.start()
    ctx = Context("learn", None)
    first = decoder.open({"n": 2}, ctx, max_tokens=10, arrival=now[0], ends_by=now[0] + 99)
    events(first)  # 2 steps of 1 s: a step is 1 s, a generation holds its place 2 s
    with pytest.raises(Overloaded) as late:
        decoder.admit(now[0] + 0.5)  # a free place, but the first token takes a step
    assert late.value.reason == "predicted_late"
    assert late.value.retry_after_s == pytest.approx(1.0)
    decoder.admit(now[0] + 1.5)
    handler.hold.clear()
    handler.stepping.clear()
    running = decoder.open(
        {"n": 2}, Context("running", None), max_tokens=10, arrival=now[0], ends_by=now[0] + 99
    )
    assert handler.stepping.wait(WAIT_S)
    # The one place is taken: the next waits for it (2 s) and a step (1 s).
    with pytest.raises(Overloaded):
        decoder.admit(now[0] + 2.5)
    decoder.admit(now[0] + 3.5)
    handler.hold.set()
    events(running)
    assert decoder.stop(WAIT_S)


def test_the_watchdog_gives_up_on_a_step_past_every_deadline_of_its_generations() -> None:
    handler = Counting()
    decoder = decoder_for(handler)
    handler.hold.clear()  # the step hangs
    now = time.monotonic()
    ctx = Context("hung", now + 1.0)
    hung = decoder.open({"n": 3}, ctx, max_tokens=10, arrival=now, ends_by=now + 1.0)
    assert handler.stepping.wait(WAIT_S)
    verdicts: list[Verdict] = []
    assert decoder.stalled(now + 2.5, 2.0) is None  # within the margin
    watching = Watchdog(
        decoder,
        hang_margin_s=2.0,
        max_rss_bytes=0,
        on_verdict=verdicts.append,
        clock=lambda: now + 3.5,
    )
    verdict = watching.check()
    assert verdict is not None
    assert verdict.urgent
    assert "past every deadline" in verdict.reason
    # Its generation is failed now, and new ones are refused: another worker serves them.
    assert isinstance(events(hung)[-1], NotReady)
    with pytest.raises(NotReady):
        decoder.admit(time.monotonic() + WAIT_S)
    handler.hold.set()
    assert decoder.stop(WAIT_S)
