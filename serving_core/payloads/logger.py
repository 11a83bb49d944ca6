"""``PayloadLog``: one worker's queue of sampled exchanges and the thread that sends them.

The request path pays for a hash of the request id (``sampler``) and, when
picked, an append to a bounded queue (``offer``); it never waits on the sink.
Redaction, the event and its JSON are made on the sender thread, one native
thread per worker started after fork, which sends what the queue holds in one
write per batch. So a slow or dead sink never slows or fails a request:

- the queue full (the sink slower than the traffic, or away), ``offer`` drops the
  exchange and counts it ``dropped``;
- a send that fails counts its events ``failed``, closes the connection and
  opens it again after a back-off (0.1 s, doubling to 5 s), meanwhile the queue
  fills and then drops;
- at worker exit, ``stop`` sends what is queued for up to a couple of seconds
  and counts what is left ``dropped``.

Each outcome is counted through the observer (``serving_payload_events_total``
on ``/metrics``), and a sink's outage is logged once when it starts and once
when it ends, its URL masked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from serving_core import context
from serving_core.errors import ServingError
from serving_core.handler import Handler, Output, Params
from serving_core.payloads import sinks
from serving_core.payloads.event import Exchange, Origin, encode, event
from serving_core.payloads.redaction import Redaction
from serving_core.payloads.sampler import Sampler
from serving_core.settings import Settings
from serving_core.settings.secrets import masked, scrubbed
from serving_core.tracing.tracer import tracer

log = logging.getLogger("serving_core.payloads")

OUTCOMES = ("sent", "dropped", "failed")
BATCH = 64  # events per write at most
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
STOP_S = 2.0
# The sender's wait for the next event: a bound, in case a wake-up was missed.
IDLE_WAIT_S = 1.0


class PayloadObserver(Protocol):
    def payload_events(self, outcome: str, count: int) -> None:
        """``count`` events ended in ``outcome``: one of ``OUTCOMES``."""
        ...


class PayloadLog:
    def __init__(
        self,
        url: str,
        *,
        origin: Origin,
        sampler: Sampler,
        redaction: Redaction | None = None,
        queue_size: int = 1000,
        observer: PayloadObserver | None = None,
        open_sink: Callable[[str], sinks.EventSink] = sinks.open_sink,
    ) -> None:
        self.url = url
        self.origin = origin
        self.sampler = sampler
        self.redaction = redaction or Redaction()
        self.queue_size = queue_size
        self._observer = observer
        self._open_sink = open_sink
        # A deque, not a queue.Queue: an append takes no lock, so a gevent worker's
        # hub never waits on one the sender holds.
        self._queue: deque[Exchange] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._down = False

    @classmethod
    def from_settings(
        cls, settings: Settings, handler: Handler, observer: PayloadObserver | None = None
    ) -> PayloadLog | None:
        """The worker's log as the SERVING_PAYLOAD_LOG_* settings say; None: off."""
        if not settings.payload_log_url:
            return None
        return cls(
            settings.payload_log_url,
            origin=Origin.of(handler, settings.model_revision),
            sampler=Sampler(settings.payload_log_rate, settings.payload_log_errors),
            redaction=Redaction((*settings.payload_log_redact, *handler.redact)),
            queue_size=settings.payload_log_queue,
            observer=observer,
        )

    def start(self) -> None:
        """After fork: the sender thread (a thread does not survive a fork)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="serving-payloads", daemon=True)
            self._thread.start()
            log.info("payload log: sampled exchanges go to %s", masked(self.url))

    def offer(
        self,
        request_id: str,
        params: Params,
        output: Output | None = None,
        error: ServingError | None = None,
    ) -> bool:
        """Queue the exchange if the sampler picks it and the queue has room (else it is
        dropped and counted); returns at once, whether it was queued."""
        if not self.sampler.picks(request_id, failed=error is not None):
            return False
        if len(self._queue) >= self.queue_size:
            self._count("dropped", 1)
            return False
        self._queue.append(Exchange(request_id, params, output, error, time.time(), _trace()))
        self._wake.set()
        return True

    def stop(self, timeout_s: float = STOP_S) -> None:
        """At worker exit: send what is queued for up to ``timeout_s``; count the rest
        dropped."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._drop_queued()

    # -- the sender thread --------------------------------------------------------

    def _run(self) -> None:
        sink: sinks.EventSink | None = None
        backoff = BACKOFF_MIN_S
        try:
            while exchanges := self._next():
                encoded = self._encode(exchanges)
                if not encoded:
                    continue
                try:
                    if sink is None:
                        sink = self._open_sink(self.url)
                    sink.send(encoded)
                except Exception as error:  # any sink's, whatever it raises: never a request's
                    sent = error.sent if isinstance(error, sinks.SinkFailed) else 0
                    self._count("sent", sent)
                    self._count("failed", len(encoded) - sent)
                    self._lost(error)
                    _close(sink)
                    sink = None
                    if self._stopping.is_set():
                        self._drop_queued()  # a worker leaving waits on no dead sink
                        return
                    self._stopping.wait(backoff)
                    backoff = min(2 * backoff, BACKOFF_MAX_S)
                else:
                    self._count("sent", len(encoded))
                    backoff = BACKOFF_MIN_S
                    if self._down:
                        self._down = False
                        log.info("payload log: %s takes events again", masked(self.url))
        finally:
            _close(sink)

    def _next(self) -> list[Exchange]:
        """Up to ``BATCH`` queued exchanges, waiting for one; [] once stopping and empty."""
        queue = self._queue
        while True:
            # Cleared before looking: an offer after the look sets it again.
            self._wake.clear()
            taken = [queue.popleft() for _ in range(min(BATCH, len(queue)))]
            if taken:
                return taken
            if self._stopping.is_set():
                return []
            self._wake.wait(IDLE_WAIT_S)

    def _encode(self, exchanges: list[Exchange]) -> list[sinks.Encoded]:
        encoded = []
        for exchange in exchanges:
            cloud_event = event(exchange, self.origin, self.redaction)
            try:
                encoded.append((str(cloud_event["id"]), encode(cloud_event)))
            except TypeError as error:  # an answer JSON cannot hold: this event only
                self._count("failed", 1)
                log.warning(
                    "payload log: request %s's event is not JSON (%s); not sent",
                    exchange.request_id,
                    error,
                )
        return encoded

    def _lost(self, error: Exception) -> None:
        if self._down:
            return
        self._down = True
        said = scrubbed(str(error), self.url)
        log.warning(
            "payload log: %s failed (%s: %s); events are dropped and counted in "
            "serving_payload_events_total until it takes them again",
            masked(self.url),
            type(error).__name__,
            said,
        )

    def _drop_queued(self) -> None:
        dropped = 0
        while self._queue:
            try:
                self._queue.popleft()
            except IndexError:  # the sender took it meanwhile
                break
            dropped += 1
        self._count("dropped", dropped)

    def _count(self, outcome: str, count: int) -> None:
        if count and self._observer is not None:
            self._observer.payload_events(outcome, count)


def _trace() -> str | None:
    """The request's span, for the event's ``traceparent``: the request's ``Context``'s,
    else the span current here (the front door's); None with traces off."""
    current = context.current()
    if current is not None and current.traceparent:
        return current.traceparent
    return tracer().current()


def _close(sink: sinks.EventSink | None) -> None:
    if sink is not None:
        try:
            sink.close()
        except Exception as error:  # closing a broken connection may fail as it broke
            log.debug("payload log: closing the sink: %s", error)
