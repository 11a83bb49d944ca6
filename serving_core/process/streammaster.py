"""``serving-core stream``: the handler over a broker's messages, results to a sink.

    master    ``prefork.Prefork``: preload, fork SERVING_WORKERS consumers, fork again
              one that dies; /metrics and /healthz on SERVING_BIND
    consumer  setup_worker(), torch threads = cores // workers, open the source, the
              sink and the dead-letter sink, then ``loops.stream.StreamLoop``

SIGTERM: each consumer publishes and acks the batch in hand, then exits. A
consumer killed outright loses nothing: the broker hands its unacked messages
out again (RabbitMQ when its channel closes; Redis Streams once they have been
idle for the source's ``claim_idle_ms``).
"""

from __future__ import annotations

from serving_core.loops.stream import Ends, StreamLoop
from serving_core.metrics.stream import StreamMetrics
from serving_core.process.prefork import Prefork
from serving_core.settings import Settings
from serving_core.stream.backend import open_sink, open_source


class StreamMaster(Prefork):
    """``serving-core stream``'s master: its consumers run a ``StreamLoop`` each."""

    command = "serving-core stream"

    def describe(self) -> str:
        return f"{self.command}: {self.settings.workers} consumer(s) of {_where(self.settings)}"

    def consume(self, slot: int, stopping: dict[str, bool]) -> int:
        engine, _ = self.consumer_engine()  # its Metrics count model failures on /metrics
        settings = self.settings
        name = self.consumer_name()

        def open_ends() -> Ends:
            return Ends(
                open_source(settings.stream_source, settings.max_batch_size, name),
                open_sink(settings.stream_sink),
                open_sink(settings.stream_dead_letter, "SERVING_STREAM_DEAD_LETTER"),
            )

        StreamLoop(
            engine,
            open_ends,
            max_batch_size=settings.max_batch_size,
            max_attempts=settings.stream_max_attempts,
            stopping=lambda: stopping["asked"],
            metrics=StreamMetrics(),
        ).run()
        return 0


def check(settings: Settings) -> None:
    """The three ends are set: raises ``ValueError`` naming the one that is not."""
    for variable, value in (
        ("SERVING_STREAM_SOURCE", settings.stream_source),
        ("SERVING_STREAM_SINK", settings.stream_sink),
        ("SERVING_STREAM_DEAD_LETTER", settings.stream_dead_letter),
    ):
        if not value:
            raise ValueError(
                f"{variable} is not set; serving-core stream needs a source, a sink and a "
                "dead-letter destination (see docs/settings.md)"
            )


def _where(settings: Settings) -> str:
    """The source's URL without its password, for the log."""
    scheme, sep, rest = settings.stream_source.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}"
