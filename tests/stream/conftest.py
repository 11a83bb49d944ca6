"""The brokers tests/stream's end-to-end tests run over: one ``broker`` fixture, a param each."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import pytest

from tests.stream.redis_broker import Item, RedisBroker


class Broker(Protocol):
    """What each broker's test class has (the spec's): a context manager that runs it."""

    source_url: str
    sink_url: str
    dead_url: str

    def __enter__(self) -> Broker: ...
    def __exit__(self, *exc: object) -> None: ...
    def produce(self, items: list[Item]) -> None: ...
    def results(self) -> list[Item]: ...
    def dead(self) -> list[Item]: ...
    def lag(self) -> int: ...
    def restart(self) -> None: ...


# A broker more is one entry more (its class in tests/stream/BROKER_broker.py).
BROKERS: dict[str, Callable[[], Broker]] = {"redis": RedisBroker}


@pytest.fixture(params=list(BROKERS))
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    with BROKERS[request.param]() as running:
        yield running
