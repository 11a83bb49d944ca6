"""Where events go, by SERVING_PAYLOAD_LOG_URL's scheme.

``SINKS`` maps a scheme to the module of its sink, imported only when a URL of
that scheme is used: ``http://`` and ``https://`` POST each event
(``httpsink``); every broker ``serving-core stream`` publishes to (Redis
Streams, RabbitMQ, Kafka: ``stream.brokers.BROKERS``) takes events as it takes
results (``brokersink``), so a broker added there is a sink here too. A sink's
module has the functions of ``SinkKind``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Protocol, cast

from serving_core.settings.secrets import masked
from serving_core.stream.brokers import BROKERS

VARIABLE = "SERVING_PAYLOAD_LOG_URL"
_HTTP = "serving_core.payloads.httpsink"
_BROKER = "serving_core.payloads.brokersink"
SINKS: dict[str, str] = {"http": _HTTP, "https": _HTTP, **dict.fromkeys(BROKERS, _BROKER)}

# One event as a sink sends it: its id, and its structured-mode JSON.
Encoded = tuple[str, bytes]


class SinkFailed(Exception):
    """A sink took the first ``sent`` events of a batch, and not the rest."""

    def __init__(self, message: str, sent: int = 0) -> None:
        super().__init__(message)
        self.sent = sent


class EventSink(Protocol):
    """One worker's connection to the sink, used by its sender thread only."""

    def send(self, events: Sequence[Encoded]) -> None:
        """Returns once the sink has taken every one; raises otherwise (``SinkFailed``
        when it took some: the caller counts the rest failed, else all of them)."""
        ...

    def close(self) -> None: ...


class SinkKind(Protocol):
    """What a module of ``SINKS`` provides. ``check`` raises ``ValueError`` saying what is
    wrong with the URL (``masked``) and how to fix it; it connects to nothing."""

    def check(self, url: str) -> None: ...

    def open_sink(self, url: str) -> EventSink: ...


def kind(url: str) -> SinkKind:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in SINKS:
        schemes = ", ".join(f"{known}://" for known in SINKS)
        raise ValueError(
            f"{VARIABLE}={masked(url)!r}: {scheme + sep if sep else 'no scheme'} names no "
            f"payload sink; use a URL of one of {schemes} (docs/observability.md)"
        )
    return cast(SinkKind, importlib.import_module(SINKS[scheme]))


def check(url: str) -> None:
    """SERVING_PAYLOAD_LOG_URL at start-up (empty: off): ``ValueError`` naming it."""
    if not url:
        return
    try:
        kind(url).check(url)
    except ValueError as error:
        message = str(error)
        raise ValueError(
            message if message.startswith(VARIABLE) else f"{VARIABLE}={message}"
        ) from None


def open_sink(url: str) -> EventSink:
    return kind(url).open_sink(url)
