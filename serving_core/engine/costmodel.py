"""Predicts how long ``predict_batch`` takes for a batch of ``n`` items.

Fits ``t(n) = a + b*n`` to the batches this worker actually ran. Each batch
size keeps its last ``window`` durations and contributes their median, so a
stray slow batch (a GC pause, a noisy neighbour) moves nothing; the line is a
weighted least-squares fit over those medians, refitted on every observation
(cost: one pass over the distinct sizes seen, at most ``max_batch_size``).
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Any


class CostModel:
    def __init__(self, window: int = 16) -> None:
        self._window = window
        self._samples: dict[int, deque[float]] = {}
        # (intercept_s, slope_s) published as one tuple: request threads read it
        # without a lock while the model thread replaces it.
        self._fit: tuple[float, float] | None = None
        self.observed = 0

    def reset(self) -> None:
        """Forget what was observed (the warm-up's first call pays for lazy initialisation)."""
        self._samples.clear()
        self._fit = None
        self.observed = 0

    def observe(self, size: int, duration_s: float) -> None:
        samples = self._samples.get(size)
        if samples is None:
            samples = self._samples[size] = deque(maxlen=self._window)
        samples.append(duration_s)
        self.observed += 1
        self._fit = self._refit()

    def predict(self, size: int) -> float:
        """Seconds for a batch of ``size``; 0.0 until something has been observed."""
        fit = self._fit
        if fit is None or size <= 0:
            return 0.0
        intercept, slope = fit
        return intercept + slope * size

    @property
    def intercept_s(self) -> float:
        """The fixed cost of a batch, whatever its size: what batching amortises."""
        fit = self._fit
        return 0.0 if fit is None else fit[0]

    @property
    def known(self) -> bool:
        return self._fit is not None

    def describe(self) -> dict[str, Any]:
        fit = self._fit
        return {
            "batches_observed": self.observed,
            "intercept_ms": None if fit is None else round(fit[0] * 1000, 3),
            "per_item_ms": None if fit is None else round(fit[1] * 1000, 3),
            "median_ms_by_size": {
                size: round(statistics.median(s) * 1000, 3)
                for size, s in sorted(self._samples.items())
            },
        }

    def _refit(self) -> tuple[float, float]:
        points = [
            (float(size), statistics.median(s), float(len(s))) for size, s in self._samples.items()
        ]
        if len(points) == 1:
            # One size seen: assume no fixed cost, the pessimistic choice for
            # larger batches (batching never costs more per item).
            size, median, _ = points[0]
            return 0.0, median / size
        total = sum(w for _, _, w in points)
        mean_x = sum(x * w for x, _, w in points) / total
        mean_y = sum(y * w for _, y, w in points) / total
        var = sum(w * (x - mean_x) ** 2 for x, _, w in points)
        cov = sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points)
        slope = max(0.0, cov / var)
        intercept = mean_y - slope * mean_x
        if intercept < 0.0:
            # Clamp to a line through the origin fitted to the same points.
            intercept = 0.0
            slope = sum(w * x * y for x, y, w in points) / sum(w * x * x for x, _, w in points)
        return intercept, slope
