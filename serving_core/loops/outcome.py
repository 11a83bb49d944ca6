"""What became of one batch of a stream's messages (``Batch``): the results and dead
letters to publish, and, traced, the spans of its messages and of what it publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving_core import encoding
from serving_core.stream.base import Message, Outgoing
from serving_core.tracing.traceparent import HEADER as TRACEPARENT
from serving_core.tracing.tracer import Span, tracer

# A dead letter's header holding its error's type, for readers that route on headers
# (the body holds the whole error).
ERROR_HEADER = "error"
# A dead letter the broker refused is sent again with its input cut to this many
# characters and its error's message to ``MESSAGE_CHARS``: small enough for any broker
# (librdkafka's message.max.bytes is 1000 at its least).
INPUT_CHARS = 256
MESSAGE_CHARS = 400


@dataclass
class Batch:
    """What became of one batch's messages: results and dead letters to publish."""

    results: list[Outgoing] = field(default_factory=list)
    dead: list[Outgoing] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)
    # Traced: each message's span (by the message object's id: ids may repeat), and
    # the spans of what is published, ended once it is sent.
    spans: dict[int, Span] = field(default_factory=dict)
    publishing: list[Span] = field(default_factory=list)
    system: str = ""
    # Each result's and dead letter's input (by the outgoing object's id).
    inputs: dict[int, Message] = field(default_factory=dict)
    refused_results: int = 0  # results the broker refused: dead letters instead

    @property
    def published(self) -> int:
        return len(self.results) - self.refused_results

    def dead_letter(self, message: Message, kind: str, text: str, runs: int, why: str) -> None:
        body = {
            "error": {"type": kind, "message": text},
            "input": message.body.decode(errors="replace"),
            "attempts": runs,
        }
        headers = {**self.headers_for(message), ERROR_HEADER: kind}
        letter = Outgoing(message.id, encoding.dumps(body), headers, message.key)
        self.dead.append(letter)
        self.inputs[id(letter)] = message
        self.reasons[why] = self.reasons.get(why, 0) + 1
        if (span := self.spans.get(id(message))) is not None:
            span.set("error.type", kind)

    def result(self, message: Message, output: bytes) -> None:
        outgoing = Outgoing(message.id, output, self.headers_for(message), message.key)
        self.results.append(outgoing)
        self.inputs[id(outgoing)] = message

    def result_refused(self, result: Outgoing, reason: str) -> Outgoing:
        """The dead letter of a result the broker refused (too large, say)."""
        self.refused_results += 1
        text = (
            f"the broker refused its result of {len(result.body)} bytes ({reason}); raise "
            "the sink's limit, or have the handler answer less"
        )
        self.dead_letter(self.inputs[id(result)], "result_refused", text, 1, "refused")
        return self.dead[-1]

    def cut(self, letter: Outgoing, reason: str) -> Outgoing:
        """A dead letter the broker refused, again with its input cut to ``INPUT_CHARS``
        characters: its error, and the input's start, reach the dead letters."""
        message = self.inputs[id(letter)]
        whole = encoding.loads(letter.body)
        error = whole["error"]
        said = f"{error['message']} (the whole dead letter was refused too: {reason})"
        text = message.body.decode(errors="replace")
        body = {
            "error": {"type": error["type"], "message": said[:MESSAGE_CHARS]},
            "input": text[:INPUT_CHARS],
            "input_truncated": len(text) > INPUT_CHARS,
            "input_bytes": len(message.body),
            "attempts": whole["attempts"],
        }
        # Long headers too may be what was refused: only short ones go with it.
        headers = {k: v for k, v in letter.headers.items() if len(k) + len(v) <= INPUT_CHARS}
        short = Outgoing(letter.id, encoding.dumps(body), headers, letter.key)
        self.inputs[id(short)] = message
        return short

    def headers_for(self, message: Message) -> dict[str, str]:
        """The input's headers, which travel to its result; traced, with the
        ``traceparent`` of the result's ``publish`` span, a child of the message's."""
        span = self.spans.get(id(message))
        if span is None:
            return message.headers
        publish = tracer().start(
            "publish",
            parent=span.traceparent,
            kind="producer",
            attributes={"messaging.system": self.system, "messaging.message.id": message.id},
        )
        self.publishing.append(publish)
        return {**message.headers, TRACEPARENT: publish.traceparent or ""}

    def end_spans(self) -> None:
        for span in (*self.publishing, *self.spans.values()):
            span.end()
