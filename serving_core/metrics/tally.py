"""A histogram's observations, added up in memory between writes."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any


class Tally:
    """A histogram's observations, added up in memory and written by ``flush``.

    In multiprocess mode each ``observe`` writes twice to a memory-mapped file,
    under a lock, and prometheus-client has no call that observes many values
    at once. The model thread observes three histograms per batch: six writes
    under a lock per request for an unbatched handler. A tally counts in plain
    Python instead and, on flush, adds each bucket's count and the sum through
    the histogram's own values. ``_sum``, ``_buckets`` and ``_upper_bounds``
    are prometheus-client's internals (pinned in requirements.txt);
    tests/test_metrics.py checks that a flushed tally writes what ``observe``
    would have. Not thread-safe: its owner locks.
    """

    def __init__(self, histogram: Any) -> None:
        self._histogram = histogram
        self._bounds: list[float] = list(histogram._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = False

    def observe(self, amount: float) -> None:
        self._sum += amount
        # The first bound >= amount, as ``Histogram.observe`` picks it (the last is +Inf).
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._pending = True

    def flush(self) -> None:
        if not self._pending:
            return
        histogram, counts = self._histogram, self._counts
        histogram._sum.inc(self._sum)
        for index, count in enumerate(counts):
            if count:
                histogram._buckets[index].inc(count)
                counts[index] = 0
        self._sum = 0.0
        self._pending = False
