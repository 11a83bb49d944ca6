"""``serving-core stream``'s metrics: messages consumed, published, dead-lettered and
redelivered, and the source's lag, summed over the consumer processes."""

from __future__ import annotations


class StreamMetrics:
    """A consumer's counts; made after fork, as ``metrics.Metrics`` (a registry each)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        r = self.registry
        self.consumed = Counter(
            "serving_stream_consumed_total",
            "Messages taken from SERVING_STREAM_SOURCE (a redelivery counts again).",
            registry=r,
        )
        self.published = Counter(
            "serving_stream_published_total",
            "Results the sink confirmed (SERVING_STREAM_SINK).",
            registry=r,
        )
        self.dead_lettered = Counter(
            "serving_stream_dead_lettered_total",
            "Messages sent to SERVING_STREAM_DEAD_LETTER with their error, by reason "
            "(invalid: not JSON, or refused by the handler; failed: the model failed "
            "SERVING_STREAM_MAX_ATTEMPTS times; exhausted: delivered more times than that; "
            "refused: the broker refused its result, too large).",
            ["reason"],
            registry=r,
        )
        self.redelivered = Counter(
            "serving_stream_redelivered_total",
            "Messages the broker handed out again (their consumer died, or lost the broker "
            "before it acked them).",
            registry=r,
        )
        self.reconnects = Counter(
            "serving_stream_reconnects_total",
            "Times a consumer lost its broker and opened its ends again.",
            registry=r,
        )
        self.lag = Gauge(
            "serving_stream_lag",
            "Messages waiting in the source: the queue's depth, or the group's pending "
            "entries plus those not yet delivered, as a live consumer last read it.",
            multiprocess_mode="livemax",
            registry=r,
        )
        # Kafka's: each consumer holds some partitions, so each says its own (and 0 for
        # one it gave up, so that the max over live consumers is the holder's).
        self.partition_lag = Gauge(
            "serving_stream_partition_lag",
            "Messages waiting in a partition of the source (Kafka: the high watermark "
            "less the offset to commit next), as the consumer holding it last read it.",
            ["partition"],
            multiprocess_mode="livemax",
            registry=r,
        )
        for reason in ("invalid", "failed", "exhausted", "refused"):
            self.dead_lettered.labels(reason)
