"""What the batcher tells about its work: ``Observer``, which the metrics implement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Observer(Protocol):
    """Receives what the batcher does; metrics implement it."""

    def batch(self, size: int, duration_s: float, queue_waits_s: Sequence[float]) -> None: ...

    def rejected(self, reason: str) -> None: ...

    def depth(self, depth: int) -> None: ...

    def flush(self) -> None:
        """Write what was added up."""
        ...

    def flush_in(self) -> float | None:
        """Seconds until what was added up is due to be written; None: nothing is."""
        ...


class NoObserver:
    """An observer that keeps nothing: a batcher built without metrics."""

    def batch(self, size: int, duration_s: float, queue_waits_s: Sequence[float]) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass

    def depth(self, depth: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def flush_in(self) -> float | None:
        return None


class GenerationObserver(Protocol):
    """Receives what the decoder does with generating handlers; metrics implement it."""

    def step(self, size: int, duration_s: float) -> None:
        """One step of ``size`` generations took ``duration_s``."""
        ...

    def chunks(self, first_waits_s: Sequence[float], gaps_s: Sequence[float]) -> None:
        """One step's chunks: each first chunk's wait since its request arrived (the
        time to first token), each later one's gap since the one before it (the
        inter-token latency)."""
        ...

    def ended(self, reason: str) -> None:
        """A generation left: stop, length, error, deadline or gone (its client hung up)."""
        ...

    def active(self, running: int, waiting: int) -> None:
        """How many generations run, and how many wait to join."""
        ...

    def rejected(self, reason: str) -> None: ...


class NoGenerationObserver:
    """A decoder's observer that keeps nothing."""

    def step(self, size: int, duration_s: float) -> None:
        pass

    def chunks(self, first_waits_s: Sequence[float], gaps_s: Sequence[float]) -> None:
        pass

    def ended(self, reason: str) -> None:
        pass

    def active(self, running: int, waiting: int) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass
