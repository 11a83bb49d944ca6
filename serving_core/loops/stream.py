"""A ``serving-core stream`` consumer's loop: take a batch, run it, publish, then ack.

    take up to SERVING_MAX_BATCH_SIZE messages
    → run them (``running.MessageRunner``): no id (an AMQP message without
      message_id), no body, not a JSON object → dead letter; one handed out again
      runs alone, and one that killed its consumer SERVING_STREAM_MAX_ATTEMPTS
      times → dead letter, unrun (``suspects``: only the killer, not its batch-mates)
    → one Engine call for the rest; a handler's refusal (4xx) → dead letter
      a model failure (5xx): its items run again alone (``isolation``: a poison
      message fails without its batch-mates), up to SERVING_STREAM_MAX_ATTEMPTS
      runs → dead letter
    → send the results, then the dead letters, as the next batch starts
    → while that batch runs (or at once, when none came): await both sinks'
      confirms, then ack the whole batch
      a sink's ``Refused`` (the broker refused a message for its size): what it did
      not confirm is sent again alone; a result refused alone → dead letter; a dead
      letter refused alone → again with its input cut short (``outcome.Batch.cut``);
      refused even so → logged. Then acked, all the same: never delivered for ever.

The model runs on a thread of its own (``Running``), and this thread talks to the
broker meanwhile: while the model runs a batch, the one before it is published,
confirmed and acked, and the next is taken. A broker's round trip waits for the
broker's process to be scheduled beside the model; overlapped, it no longer idles
the model's core (the loop once did each in turn, and its two consumers used
1.8 of the two cores).

Acked last, so a consumer that dies, or loses its broker, before the sinks
confirmed loses nothing: the source hands the batch out again (at-least-once;
a result may then be published twice, once per delivery). A ``BrokerError``
closes the ends and opens them again after a back-off (exponential, jittered,
capped), so a broker that restarts is waited for rather than crash-looped on;
it starts again from its first step only once a batch has been acked (or a
take found nothing to do), not at the first take that works.

Traced, each message is a ``message NAME`` span (a consumer's), a child of the
span its ``traceparent`` header names (a new trace without one); the engine's
contexts carry those spans, so the batch's ``model`` span links to each. Its
result (or dead letter) is a ``publish`` span under it, whose ``traceparent``
the outgoing headers carry: a consumer of the sink continues the trace.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from serving_core import threads
from serving_core.engine.engine import Engine
from serving_core.loops.inflight import Ends, Running, Sent
from serving_core.loops.outcome import Batch
from serving_core.loops.running import MessageRunner
from serving_core.loops.suspects import Suspects
from serving_core.metrics.stream import StreamMetrics
from serving_core.stream.base import (
    BrokerError,
    KeptAlive,
    Message,
    MessageSink,
    MessageSource,
    Outgoing,
    PartitionedSource,
    Refused,
)

log = logging.getLogger("serving_core.loops.stream")

TAKE_WAIT_S = 1.0  # how long a take blocks: the longest a stop request waits to be seen
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
LAG_EVERY_S = 1.0  # the lag gauge is read from the broker at most this often


@dataclass
class StreamLoop:
    """A consumer's loop over a broker: take a batch, run it, publish, then ack."""

    engine: Engine
    open_ends: Callable[[], Ends]
    max_batch_size: int
    max_attempts: int
    stopping: Callable[[], bool]
    metrics: StreamMetrics
    system: str = ""  # the broker, on each message's span (``brokers.system``)
    # Where the count of consumers each message killed outlives them (``suspects``).
    suspects: Suspects = field(default_factory=Suspects)
    _lag_at: float = 0.0
    _failures: int = 0  # BrokerErrors since the last batch that was acked

    def __post_init__(self) -> None:
        self.runner = MessageRunner(self.engine, self.max_attempts, self.suspects, self.system)
        # One thread runs the model, with this one's torch threads, while this one talks
        # to the broker (``_serve``); one, so batches run in turn, as they are taken.
        count = threads.model_threads()
        self._model = ThreadPoolExecutor(
            1,
            thread_name_prefix="stream-model",
            initializer=lambda: None if count is None else threads.set_model_threads(count),
        )

    def run(self) -> None:
        try:
            self._run()
        finally:
            self._model.shutdown(wait=True)

    def _run(self) -> None:
        while not self.stopping():
            ends: Ends | None = None
            try:
                ends = self.open_ends()
                self._serve(ends)
            except BrokerError as error:
                self._failures += 1
                self.metrics.reconnects.inc()
                pause_s = _backoff_s(self._failures)
                log.warning("lost the broker (%s); reconnecting in %.1f s", error, pause_s)
                self._pause(pause_s)
            finally:
                if ends is not None:
                    ends.close()

    def _serve(self, ends: Ends) -> None:
        # Three batches in hand at most, each overlapping the model (issue 44): the one the
        # model thread runs; the one before it, whose results this thread sends, then
        # awaits their confirms and acks; and the next, taken meanwhile. So the broker's
        # round trips (a take, a publish, a confirm, an ack: each waits for the broker's
        # process to be scheduled beside the model) never leave the model's core idle.
        # All stay unacked until confirmed: a crash redelivers them.
        sent: Sent | None = None
        running: Running | None = None
        # Asked once per connection: a Protocol's isinstance is no check for every take.
        partitioned = ends.source if isinstance(ends.source, PartitionedSource) else None
        alive = [end for end in (ends.source, ends.sink, ends.dead) if isinstance(end, KeptAlive)]

        def keepalive() -> None:
            for end in alive:
                end.keepalive()

        try:
            while True:
                if running is None:
                    if self.stopping():
                        break
                    # With a batch awaiting its confirms, take what is already here and no
                    # more: waiting for new messages would hold that batch's acks.
                    messages = self._take(ends, partitioned, 0.0 if sent else TAKE_WAIT_S)
                    if not messages:
                        if sent:
                            self._settle(ends, sent)
                            sent = None
                        # Idle, the sinks see no call till the next batch's results.
                        keepalive()
                        continue
                    running = self._start(messages)
                # Busy until sent: a peer that borrowed this consumer's core while it
                # publishes would oversubscribe the next batch (``threads.busy``).
                with threads.busy():
                    if sent:  # its results went out as the model started this batch
                        self._settle(ends, sent)
                        sent = None
                    ahead = [] if self.stopping() else self._take(ends, partitioned, 0.0)
                    batch = running.batch(keepalive)
                    done, running = running, self._start(ahead) if ahead else None
                    sent = self._send(ends, done.messages, batch)
            if sent:  # stopping: the batch in hand is confirmed and acked before the exit
                self._settle(ends, sent)
        finally:
            if running is not None:  # a lost broker: the model finishes, unpublished
                running.abandon()

    def _take(
        self, ends: Ends, partitioned: PartitionedSource | None, wait_s: float
    ) -> list[Message]:
        messages = ends.source.take(self.max_batch_size, wait_s)
        self._observe_lag(ends.source, partitioned)
        if not messages:
            if self._failures and wait_s > 0:  # idle, nothing in hand, and the broker answers
                log.info("reconnected to the stream's broker after %d failure(s)", self._failures)
                self._failures = 0
            return messages
        self.metrics.consumed.inc(len(messages))
        redelivered = sum(1 for m in messages if m.deliveries > 1)
        if redelivered:
            self.metrics.redelivered.inc(redelivered)
        return messages

    def _start(self, messages: list[Message]) -> Running:
        return Running(messages, self._model.submit(self.run_batch, messages))

    def _send(self, ends: Ends, messages: list[Message], batch: Batch) -> Sent:
        try:
            # Results before dead letters, both confirmed before the ack.
            ends.sink.send(batch.results)
            ends.dead.send(batch.dead)
        finally:
            batch.end_spans()
        return Sent(messages, batch)

    def _settle(self, ends: Ends, sent: Sent) -> None:
        refusals: list[tuple[MessageSink, Refused]] = []
        for sink in (ends.sink, ends.dead):
            try:
                sink.confirm()
            except Refused as error:  # both confirmed first: nothing is left in flight
                refusals.append((sink, error))
        for sink, refused in refusals:
            log.warning("%s; each message of the batch not confirmed is sent again alone", refused)
            for outgoing in refused.undelivered:
                self._salvage(ends, sent.batch, outgoing, dead=sink is ends.dead)
        ends.source.ack(sent.messages)
        # A batch went all the way round: the back-off starts again from its first step.
        # (Not after a take: a broker that takes but refuses to publish would make the
        # consumer reconnect at once, for ever.)
        if self._failures:
            log.info("reconnected to the stream's broker after %d failure(s)", self._failures)
            self._failures = 0
        self.metrics.published.inc(sent.batch.published)
        for why, count in sent.batch.reasons.items():
            self.metrics.dead_lettered.labels(why).inc(count)

    def _salvage(self, ends: Ends, batch: Batch, outgoing: Outgoing, *, dead: bool) -> None:
        """A result or dead letter the broker may have refused, sent alone: a result
        refused alone becomes a dead letter, a dead letter refused alone is sent with its
        input cut, and one refused even so is logged. Either way its input is acked
        after: a message that cannot be published must not come back for ever."""
        sink = ends.dead if dead else ends.sink
        try:
            sink.publish([outgoing])
            return
        except Refused as alone:
            reason = alone.reason
        letter = outgoing
        if not dead:
            letter = batch.result_refused(outgoing, reason)
            try:
                ends.dead.publish([letter])
                return
            except Refused as whole:
                reason = whole.reason
        try:
            ends.dead.publish([batch.cut(letter, reason)])
        except Refused as cut:
            log.error(
                "message %r: the broker refused its result and its dead letter, even cut "
                "short (%s); it is acked unpublished",
                outgoing.id,
                cut.reason,
            )

    def run_batch(self, messages: list[Message]) -> Batch:
        return self.runner.run(messages)

    def _observe_lag(self, source: MessageSource, partitioned: PartitionedSource | None) -> None:
        if partitioned is not None:
            # Read from the consumer's own state, not the broker: after every take, so
            # that the gauge is current while a batch runs.
            for partition, waiting in partitioned.partition_lags().items():
                self.metrics.partition_lag.labels(partition).set(waiting)
        now = time.monotonic()
        if now < self._lag_at:
            return
        self._lag_at = now + LAG_EVERY_S
        lag = source.lag()
        if lag is not None:
            self.metrics.lag.set(lag)

    def _pause(self, seconds: float) -> None:
        """Sleep, but wake for a stop request (a SIGTERM while the broker is away)."""
        deadline = time.monotonic() + seconds
        while not self.stopping() and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))


def _backoff_s(failures: int) -> float:
    """Exponential, capped, with full jitter so that consumers do not reconnect in step."""
    ceiling = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** min(failures - 1, 16))
    return random.uniform(ceiling / 2, ceiling)
