"""What a stream consumer holds (``loops.stream``): its three connections to the broker,
and the batches in flight between a take and their ack."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from serving_core.loops.outcome import Batch
from serving_core.stream.base import Message, MessageSink, MessageSource

log = logging.getLogger("serving_core.loops.stream")

# How often the ends' heartbeats are seen to while a batch runs: well inside the
# shortest heartbeat a broker proposes (RabbitMQ drops a connection silent for two).
KEEPALIVE_S = 0.5


@dataclass
class Ends:
    """A consumer's three connections, opened together and closed together."""

    source: MessageSource
    sink: MessageSink
    dead: MessageSink

    def close(self) -> None:
        for end in (self.source, self.sink, self.dead):
            try:
                end.close()
            except Exception:  # a lost broker's connection may fail to close too
                log.debug("closing a stream end failed", exc_info=True)


@dataclass(frozen=True)
class Sent:
    """A batch whose results and dead letters are sent, not yet confirmed nor acked."""

    messages: list[Message]
    batch: Batch


@dataclass(frozen=True)
class Running:
    """A batch on the consumer's model thread."""

    messages: list[Message]
    future: Future[Batch]

    def batch(self, keepalive: Callable[[], None]) -> Batch:
        """The batch once the model has run it, calling ``keepalive`` every
        ``KEEPALIVE_S`` meanwhile (a batch of a slow model outlasts a heartbeat)."""
        while True:
            try:
                return self.future.result(timeout=KEEPALIVE_S)
            except TimeoutError:
                keepalive()

    def abandon(self) -> None:
        """Its broker lost: the batch is handed out again, unpublished; its spans end."""
        with contextlib.suppress(Exception):  # the model's failure was the batch's to report
            self.future.result().end_spans()
