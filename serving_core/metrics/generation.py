"""A generating handler's metrics: time to first token, inter-token latency, tokens,
steps and streams. Implements the decoder's ``GenerationObserver``."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from serving_core.metrics.tally import Tally

FLUSH_S = 0.25
# From a token a millisecond (a small model, a batch of one) to seconds (a long queue).
TOKEN_LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
STEP_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class GenerationMetrics:
    def __init__(self, registry: Any) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        r = registry
        self.first_token = Histogram(
            "serving_time_to_first_token_seconds",
            "Time from a generation's arrival to its first chunk.",
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.inter_token = Histogram(
            "serving_inter_token_latency_seconds",
            "Time between two chunks of one generation.",
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter(
            "serving_generated_tokens_total",
            "Chunks (tokens) generated; its rate is the tokens per second.",
            registry=r,
        )
        self.step_size = Histogram(
            "serving_generation_step_size",
            "Generations in one model step (continuous batching).",
            buckets=STEP_SIZE_BUCKETS,
            registry=r,
        )
        self.step_duration = Histogram(
            "serving_generation_step_duration_seconds",
            "Time one model step of the running generations took.",
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.streams = Gauge(
            "serving_active_generations",
            "Generations running in a model step (state=running) or waiting to join.",
            ["state"],
            multiprocess_mode="livesum",
            registry=r,
        )
        self.ends = Counter(
            "serving_generations_total",
            "Generations ended, by reason (stop, length, error, deadline, gone: the client "
            "hung up).",
            ["reason"],
            registry=r,
        )
        self.rejections = Counter(
            "serving_generation_rejections_total",
            "Generations refused at admission, by reason (queue_full, predicted_late).",
            ["reason"],
            registry=r,
        )
        self._tallies = (
            Tally(self.first_token),
            Tally(self.inter_token),
            Tally(self.step_size),
            Tally(self.step_duration),
        )
        self._running = self.streams.labels("running")
        self._waiting = self.streams.labels("waiting")
        self._tokens = 0
        self._lock = threading.Lock()
        self._flush_at = 0.0

    def step(self, size: int, duration_s: float) -> None:
        _, _, sizes, durations = self._tallies
        with self._lock:
            sizes.observe(size)
            durations.observe(duration_s)
        if time.monotonic() >= self._flush_at:
            self.flush()

    def chunks(self, first_waits_s: Sequence[float], gaps_s: Sequence[float]) -> None:
        firsts, gaps = self._tallies[0], self._tallies[1]
        with self._lock:
            for wait in first_waits_s:
                firsts.observe(wait)
            for gap in gaps_s:
                gaps.observe(gap)
            self._tokens += len(first_waits_s) + len(gaps_s)

    def ended(self, reason: str) -> None:
        self.ends.labels(reason).inc()

    def active(self, running: int, waiting: int) -> None:
        self._running.set(running)
        self._waiting.set(waiting)

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    def flush(self) -> None:
        with self._lock:
            for tally in self._tallies:
                tally.flush()
            tokens, self._tokens = self._tokens, 0
            self._flush_at = time.monotonic() + FLUSH_S
        if tokens:
            self.tokens.inc(tokens)
