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
