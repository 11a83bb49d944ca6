"""The front door's sequence: a 413 from the head, then admission, then the body, then
the answer; and what the answer record carries back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from serving_core.errors import NotReady, Overloaded, PayloadTooLarge
from serving_core.online.door import Answered, FrontDoor, Head
from serving_core.online.service import Service
from tests.conftest import make_app


class Refusing:
    """A service whose admission refuses, counting the asks."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.admitted = 0

    def admit(self, *, arrival: float | None = None, timeout_s: float | None = None) -> None:
        self.admitted += 1
        raise Overloaded("full", reason="queue_full", retry_after_s=1.0)


@contextmanager
def started(**env: Any) -> Iterator[Service]:
    service: Service = make_app(**env).extensions["serving_core"]
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def service() -> Iterator[Service]:
    with started(max_wait_ms=1) as service:
        yield service


def never_read() -> dict[str, Any]:
    raise AssertionError("the body was read")


def test_a_length_over_the_limit_is_a_413_before_admission_and_unread(service):
    refusing = Refusing(service.settings)
    door = FrontDoor(refusing)  # type: ignore[arg-type]
    head = Head("big", time.monotonic(), content_length=service.settings.max_body_bytes + 1)
    with pytest.raises(PayloadTooLarge) as refused:
        door.predict(head, never_read)
    assert refused.value.status == 413
    assert refusing.admitted == 0


def test_a_refusal_at_admission_comes_before_the_body_is_read(service):
    refusing = Refusing(service.settings)
    door = FrontDoor(refusing)  # type: ignore[arg-type]
    length = service.settings.max_body_bytes  # at the limit: not too large
    with pytest.raises(Overloaded):
        door.predict(Head("full", time.monotonic(), content_length=length), never_read)
    assert refusing.admitted == 1


def test_an_unstarted_service_is_not_ready_before_the_body_is_read():
    service = make_app().extensions["serving_core"]
    with pytest.raises(NotReady):
        FrontDoor(service).predict(Head("early", time.monotonic()), never_read)


def test_the_answer_carries_the_batch_the_model_ran_it_in_and_none_for_a_hit(service):
    door = FrontDoor(service)
    miss = door.predict(Head("one", time.monotonic()), lambda: {"text": "door"})
    hit = door.predict(Head("two", time.monotonic()), lambda: {"text": "door"})
    assert (miss.output["text"], miss.served, miss.batch_size) == ("door", "miss", 1)
    assert (hit.output, hit.served, hit.batch_size) == (miss.output, "hit", None)


def test_without_the_cache_the_answer_is_not_served_by_it():
    with started(cache_size=0, max_wait_ms=1) as service:
        answered = FrontDoor(service).predict(Head("x", time.monotonic()), lambda: {"text": "a"})
        assert (answered.served, answered.batch_size) == (None, 1)


def test_the_door_answers_with_the_answer_step_it_is_given(service):
    seen: list[tuple[Any, Head]] = []

    def answer(body: str, head: Head) -> Answered[str]:
        seen.append((body, head))
        return Answered(body.upper(), batch_size=3)

    head = Head("own", time.monotonic(), timeout_s=2.0, caller="abc")
    answered = FrontDoor(service).enter(head, lambda: "raw", answer)
    assert answered == Answered("RAW", None, 3)
    assert seen == [("raw", head)]


@pytest.mark.parametrize("header", [False, True])
def test_x_cache_is_told_only_with_the_cache_header_setting(header):
    with started(cache_header=header, max_wait_ms=1) as service:
        door = FrontDoor(service)
        answered = door.predict(Head("x", time.monotonic()), lambda: {"text": "told"})
        assert door.cache_header(answered) == ("miss" if header else None)
