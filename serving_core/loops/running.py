"""What a stream consumer does with one batch of messages (``MessageRunner.run``): which
are dead letters unrun, which run together, which alone, and what each became.

    each message: no id, no body, not a JSON object → dead letter, unrun
    handed out again (its consumer died, or lost its broker, holding it) → a suspect:
        run alone, counted while it runs (``suspects``); one whose count says it
        killed its consumer SERVING_STREAM_MAX_ATTEMPTS times → dead letter, unrun
    the others → one Engine call; a model failure's items run again alone
        (``isolation``); a handler's refusal (4xx) → dead letter

Only the message that kills its consumer is dead-lettered for it: its
batch-mates are handed out again with it, and each then runs alone, so the
count of deaths lands on the killer alone.
"""

from __future__ import annotations

from typing import Any

from serving_core import encoding
from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.errors import ServingError
from serving_core.loops.isolation import isolate
from serving_core.loops.outcome import Batch
from serving_core.loops.suspects import Suspects
from serving_core.stream.base import Message
from serving_core.tracing.traceparent import HEADER as TRACEPARENT
from serving_core.tracing.tracer import Span, tracer

Params = dict[str, Any]

# Handed out this many times SERVING_STREAM_MAX_ATTEMPTS, a message is dead-lettered
# unrun whatever this host counted: its consumers keep dying with it in hand, on other
# hosts too, or with their master (whose count goes with it).
HANDED_OUT_LIMIT = 4


class MessageRunner:
    def __init__(self, engine: Engine, max_attempts: int, suspects: Suspects, system: str) -> None:
        self.engine = engine
        self.max_attempts = max_attempts
        self.suspects = suspects
        self.system = system

    def run(self, messages: list[Message]) -> Batch:
        batch = Batch(system=self.system)
        if tracer().enabled:
            batch.spans = {id(message): self._span(message) for message in messages}
        together: list[tuple[Message, Params]] = []
        alone: list[tuple[Message, Params]] = []
        for message in messages:
            if not message.id:
                batch.dead_letter(
                    message,
                    "missing_id",
                    "the message has no id, so its result could not be matched to it; set "
                    "the AMQP message_id property (or the Redis entry's id field)",
                    0,
                    "invalid",
                )
                continue
            params = _params(message)
            if isinstance(params, tuple):
                batch.dead_letter(message, *params, 0, "invalid")
            elif message.deliveries == 1:
                together.append((message, params))
            elif not self._exhausted(message, batch):
                alone.append((message, params))
        for suspect in alone:
            self.suspects.running(suspect[0])
            self._run([suspect], batch)
            self.suspects.done(suspect[0])
        if together:
            self._run(together, batch)
        return batch

    def _exhausted(self, message: Message, batch: Batch) -> bool:
        """A message handed out again, dead-lettered if it killed enough consumers."""
        deaths = self.suspects.deaths(message)
        # Its first death was in a batch, not alone: that one is not counted, so it
        # runs at least twice (once alone) before it can be found out.
        if deaths >= max(1, self.max_attempts - 1):
            text = (
                f"its consumer died running it {deaths + 1} times ({deaths} of them alone), "
                f"SERVING_STREAM_MAX_ATTEMPTS={self.max_attempts}: it is not run again"
            )
        elif message.deliveries > HANDED_OUT_LIMIT * self.max_attempts:
            text = (
                f"handed out {message.deliveries} times, more than {HANDED_OUT_LIMIT} x "
                f"SERVING_STREAM_MAX_ATTEMPTS={self.max_attempts}: its consumers keep dying "
                "with it in hand, so it is not run again"
            )
        else:
            return False
        batch.dead_letter(message, "attempts_exhausted", text, deaths + 1, "exhausted")
        self.suspects.done(message)
        return True

    def _run(self, runnable: list[tuple[Message, Params]], batch: Batch) -> None:
        contexts = [
            Context(message.id, traceparent=_traceparent(batch, message)) for message, _ in runnable
        ]
        inputs = [p for _, p in runnable]
        results, runs = isolate(
            self.engine,
            inputs,
            contexts,
            self.engine.predict_many(inputs, contexts),
            max_runs=self.max_attempts,
        )
        for (message, _), result, ran in zip(runnable, results, runs, strict=True):
            if isinstance(result, ServingError):
                error = result.body()["error"]
                why = "failed" if result.status >= 500 else "invalid"
                batch.dead_letter(message, str(error["type"]), str(error["message"]), ran, why)
                if (span := batch.spans.get(id(message))) is not None:
                    span.fail(result)
            else:
                batch.result(message, encoding.dumps(result))

    def _span(self, message: Message) -> Span:
        """The message's span: a child of the producer's (its ``traceparent`` header), or
        a new trace's root."""
        return tracer().start(
            f"message {self.engine.name}",
            parent=message.headers.get(TRACEPARENT),
            kind="consumer",
            attributes={
                "messaging.system": self.system,
                "messaging.operation.type": "process",
                "messaging.message.id": message.id,
                "serving.deliveries": message.deliveries,
            },
        )


def _traceparent(batch: Batch, message: Message) -> str | None:
    span = batch.spans.get(id(message))
    return None if span is None else span.traceparent


def _params(message: Message) -> Params | tuple[str, str]:
    """The message's params, or why it has none (its dead letter's type and message)."""
    if not message.body:
        return (
            "missing_body",
            "the message has no body (a Redis Streams entry's 'body' field, or an AMQP or "
            "Kafka message's body, was missing or empty); send the handler's params in it "
            "as a JSON object",
        )
    try:
        params = encoding.loads(message.body)
    except encoding.JSONDecodeError as error:
        text = f"the message body is not JSON ({error}); send the handler's params as JSON"
        return "invalid_json", text
    if not isinstance(params, dict):
        text = "the message body is JSON but not an object; send the handler's params"
        return "invalid_json", text
    return params
