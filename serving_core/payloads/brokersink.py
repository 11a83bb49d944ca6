"""A broker as the sink: the stream worker's own sinks (``stream.brokers``), an event a
message whose body is the event (structured mode) and whose id is the event's."""

from __future__ import annotations

from collections.abc import Sequence

from serving_core.payloads.event import CONTENT_TYPE
from serving_core.payloads.sinks import VARIABLE, Encoded
from serving_core.stream import brokers
from serving_core.stream.base import MessageSink, Outgoing

HEADERS = {"content-type": CONTENT_TYPE}


def check(url: str) -> None:
    brokers.broker(url, VARIABLE).check_sink(url)


def open_sink(url: str) -> BrokerSink:
    return BrokerSink(brokers.open_sink(url, VARIABLE))


class BrokerSink:
    def __init__(self, sink: MessageSink) -> None:
        self._sink = sink

    def send(self, events: Sequence[Encoded]) -> None:
        # One write and one confirmation for what the queue held: a round trip per batch.
        self._sink.publish([Outgoing(id_, body, dict(HEADERS)) for id_, body in events])

    def close(self) -> None:
        self._sink.close()
