"""``serving-core stream``: the handler over a broker's messages, results to a sink.

    master    ``prefork.Prefork``: preload, fork SERVING_WORKERS consumers, fork again
              one that dies; /metrics and /healthz on SERVING_BIND
    consumer  setup_worker(), torch threads = cores // workers, its tracer, open the
              source, the sink and the dead-letter sink, then ``loops.stream.StreamLoop``

SIGTERM: each consumer publishes and acks the batch in hand, then exits. A
consumer killed outright loses nothing: the broker hands its unacked messages
out again (RabbitMQ when its channel closes; Redis Streams once they have been
idle for the source's ``claim_idle_ms``).
"""

from __future__ import annotations

import tempfile

from serving_core.loops.inflight import Ends
from serving_core.loops.stream import StreamLoop
from serving_core.loops.suspects import Suspects
from serving_core.metrics.stream import StreamMetrics
from serving_core.process.prefork import Prefork
from serving_core.settings import Settings
from serving_core.settings.secrets import masked
from serving_core.stream import brokers
from serving_core.stream.brokers import DEAD_LETTER, open_sink, open_source


class StreamMaster(Prefork):
    """``serving-core stream``'s master: its consumers run a ``StreamLoop`` each."""

    command = "serving-core stream"
    suspects_dir = ""

    def run(self) -> int:
        # The consumers' count of who killed them (``loops.suspects``): the master's, so
        # that it outlives each of them, and gone with the master.
        with tempfile.TemporaryDirectory(prefix="serving-stream-suspects-") as directory:
            self.suspects_dir = directory
            return super().run()

    def describe(self) -> str:
        source = masked(self.settings.stream_source)
        return f"{self.command}: {self.settings.workers} consumer(s) of {source}"

    def consume(self, slot: int, stopping: dict[str, bool]) -> int:
        engine, _ = self.consumer_engine()  # its Metrics count model failures on /metrics
        settings = self.settings
        name = self.consumer_name()

        def open_ends() -> Ends:
            return Ends(
                open_source(settings.stream_source, settings.max_batch_size, name),
                open_sink(settings.stream_sink),
                open_sink(settings.stream_dead_letter, DEAD_LETTER),
            )

        StreamLoop(
            engine,
            open_ends,
            max_batch_size=settings.max_batch_size,
            max_attempts=settings.stream_max_attempts,
            stopping=lambda: stopping["asked"],
            metrics=StreamMetrics(),
            system=brokers.system(settings.stream_source),
            suspects=Suspects(self.suspects_dir),
        ).run()
        return 0


def check(settings: Settings) -> None:
    """The three ends are set, and each broker takes its URL: raises ``ValueError``
    naming the variable (before a model loads for minutes)."""
    brokers.check(settings.stream_source, settings.stream_sink, settings.stream_dead_letter)
