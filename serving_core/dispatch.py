"""When to run a batch, and whether a new request can still be served in time.

Two policies share one cost model (``t(n) = a + b*n``, fitted per worker):

- ``FixedWindow``: wait until ``max_wait_ms`` after the first queued item
  arrived (one deadline, never reset), or until the batch is full.
- ``Adaptive``: run at once unless waiting for more items is predicted to raise
  throughput, that is, unless items arrive faster than batches of the current
  size can serve them; then wait only as long as the expected arrivals take to
  fill the batch to the size that keeps up, never past any queued item's
  deadline nor ``max_wait_ms``.

Both refuse a request at admission when its predicted completion (the batch in
flight, the queue ahead of it, its own batch) is later than its deadline.
Imports no Flask; time is passed in, so tests use a fake clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from .costmodel import CostModel


class Queued(Protocol):
    @property
    def enqueued(self) -> float: ...

    @property
    def deadline(self) -> float: ...


class Policy:
    name = "base"

    def __init__(self, *, max_batch_size: int, max_wait_s: float, cost: CostModel) -> None:
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.cost = cost

    def dispatch_at(self, queue: Sequence[Queued], now: float) -> float:
        """Monotonic time at which to run what is queued; ``<= now`` means now."""
        raise NotImplementedError

    def arrived(self, now: float) -> None:
        """Called for every admitted request."""

    def observe(self, size: int, duration_s: float) -> None:
        self.cost.observe(size, duration_s)

    def batch_cost_s(self, size: int) -> float:
        return self.cost.predict(size)

    def completion_s(self, depth: int, busy_left_s: float) -> float:
        """Seconds until an item that finds ``depth`` items queued is answered."""
        full, rest = divmod(depth + 1, self.max_batch_size)
        return busy_left_s + full * self.cost.predict(self.max_batch_size) + self.cost.predict(rest)

    def drain_time_s(self, depth: int, busy_left_s: float) -> float:
        """Seconds until the queue ahead is served: the honest ``Retry-After``."""
        return self.completion_s(max(0, depth - 1), busy_left_s)

    def predicted_late(
        self, depth: int, busy_left_s: float, *, deadline: float, now: float
    ) -> float | None:
        """``None`` to admit; otherwise the seconds after which a retry could succeed."""
        if not self.cost.known:
            return None
        if now + self.completion_s(depth, busy_left_s) <= deadline:
            return None
        return self.drain_time_s(depth, busy_left_s)

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.name,
            "max_batch_size": self.max_batch_size,
            "max_wait_ms": self.max_wait_s * 1000,
            "cost_model": self.cost.describe(),
        }


class FixedWindow(Policy):
    name = "fixed"

    def dispatch_at(self, queue: Sequence[Queued], now: float) -> float:
        return queue[0].enqueued + self.max_wait_s


class ArrivalRate:
    """Requests per second from an exponentially weighted mean of the gaps between arrivals."""

    def __init__(self, alpha: float = 0.2) -> None:
        self._alpha = alpha
        self._gap_s: float | None = None
        self._last: float | None = None

    def arrived(self, now: float) -> None:
        if self._last is not None:
            gap = max(0.0, now - self._last)
            self._gap_s = (
                gap if self._gap_s is None else self._gap_s + self._alpha * (gap - self._gap_s)
            )
        self._last = now

    def per_s(self, now: float) -> float:
        if self._gap_s is None or self._last is None:
            return 0.0
        # A silence longer than the usual gap is evidence of a lower rate: an
        # idle queue must never be held for arrivals that are not coming.
        gap = max(self._gap_s, now - self._last)
        return math.inf if gap == 0.0 else 1.0 / gap


class Adaptive(Policy):
    name = "adaptive"

    def __init__(self, *, max_batch_size: int, max_wait_s: float, cost: CostModel) -> None:
        super().__init__(max_batch_size=max_batch_size, max_wait_s=max_wait_s, cost=cost)
        self.rate = ArrivalRate()

    def arrived(self, now: float) -> None:
        self.rate.arrived(now)

    def dispatch_at(self, queue: Sequence[Queued], now: float) -> float:
        size = len(queue)
        rate = self.rate.per_s(now)
        if not self.cost.known or rate <= 0.0 or size >= self.max_batch_size:
            return now
        # Batches of `size` keep up when no more than `size` items arrive while
        # one runs; then waiting only adds latency.
        if rate * self.cost.predict(size) <= size:
            return now
        target = self._keeps_up_size(size, rate)
        wait = (target - size) / rate
        oldest = queue[0].enqueued
        slack = min(item.deadline for item in queue) - now - self.cost.predict(target)
        wait = min(wait, slack, oldest + self.max_wait_s - now)
        return now + max(0.0, wait)

    def _keeps_up_size(self, size: int, rate: float) -> int:
        """The smallest batch size whose run time gathers no more arrivals than it serves."""
        for candidate in range(size + 1, self.max_batch_size + 1):
            if rate * self.cost.predict(candidate) <= candidate:
                return candidate
        return self.max_batch_size


def make_policy(name: str, *, max_batch_size: int, max_wait_ms: float) -> Policy:
    cls = {"fixed": FixedWindow, "adaptive": Adaptive}[name]
    return cls(max_batch_size=max_batch_size, max_wait_s=max_wait_ms / 1000, cost=CostModel())
