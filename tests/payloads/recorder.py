"""What the payload-log tests observe: its counts, and sinks that a test controls."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from serving_core.payloads.event import Origin
from serving_core.payloads.sinks import Encoded

ORIGIN = Origin("probe", "7", "abc123+sha256:feed")


class Counts:
    """A ``PayloadObserver`` that keeps its counts."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def payload_events(self, outcome: str, count: int) -> None:
        with self._lock:
            self.counts[outcome] += count

    def __getitem__(self, outcome: str) -> int:
        with self._lock:
            return self.counts[outcome]


class HeldSink:
    """Takes events into ``received``; while ``open_`` is clear, a send waits on it (after
    setting ``entered``), so that a test, not the clock, decides when it returns."""

    def __init__(self) -> None:
        self.received: list[Encoded] = []
        self.entered = threading.Event()
        self.open_ = threading.Event()
        self.open_.set()
        self.closed = 0

    def send(self, events: Sequence[Encoded]) -> None:
        self.entered.set()
        assert self.open_.wait(30), "the test never let the sink go"
        self.received.extend(events)

    def close(self) -> None:
        self.closed += 1
