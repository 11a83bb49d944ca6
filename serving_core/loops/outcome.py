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

    def dead_letter(self, message: Message, kind: str, text: str, runs: int, why: str) -> None:
        body = {
            "error": {"type": kind, "message": text},
            "input": message.body.decode(errors="replace"),
            "attempts": runs,
        }
        headers = {**self.headers_for(message), ERROR_HEADER: kind}
        self.dead.append(Outgoing(message.id, encoding.dumps(body), headers, message.key))
        self.reasons[why] = self.reasons.get(why, 0) + 1
        if (span := self.spans.get(id(message))) is not None:
            span.set("error.type", kind)

    def result(self, message: Message, output: bytes) -> None:
        self.results.append(Outgoing(message.id, output, self.headers_for(message), message.key))

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
