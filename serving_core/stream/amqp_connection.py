"""An AMQP end's URL (SERVING_STREAM_SOURCE, _SINK or _DEAD_LETTER) and connection:
pika's connection parameters, the query parameters that are the stream's own, and
a connection with its channel whose every pika error is a ``BrokerError``."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika
import pika.exceptions

from serving_core.settings.secrets import masked
from serving_core.stream.base import BrokerError

# What pika raises when the broker is gone, refused a call, or closed the channel.
ERRORS = (pika.exceptions.AMQPError, OSError)


def amqp_url(
    url: str, what: str, keys: Iterable[str], required: Iterable[str]
) -> tuple[pika.URLParameters, dict[str, str], str]:
    """(pika's parameters, the stream's own parameters among ``keys``, the URL to show).

    Raises ValueError saying what to fix."""
    keys = list(keys)
    example = "amqp://USER:PASS@HOST:PORT/VHOST?" + "&".join(f"{k}=NAME" for k in keys)
    safe = masked(url)
    try:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as error:
        raise ValueError(f"{safe!r} is not a URL ({error}): {what} is {example}") from None
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise ValueError(f"{safe!r}: {what} is {example} (amqps:// for TLS)")
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for key, value in pairs:
        if key in ours:
            raise ValueError(f"{safe!r}: {key}= is given twice; {what} takes one")
        if key in keys:
            ours[key] = value
        else:
            theirs.append((key, value))
    for key in required:
        if not ours.get(key):
            raise ValueError(f"{safe!r}: {what} needs {key}=NAME: {example}")
    try:
        params = pika.URLParameters(urlunsplit(parts._replace(query=urlencode(theirs))))
    except ValueError as error:
        raise ValueError(
            f"{safe!r}: {error}; besides {', '.join(k + '=' for k in keys)} {what} takes "
            "pika's URL parameters (heartbeat=, socket_timeout=, ...)"
        ) from None
    return params, ours, safe


class Connected:
    """A connection and its channel; every pika error out of them is a BrokerError."""

    def __init__(self, url: str, what: str, keys: Iterable[str], required: Iterable[str]) -> None:
        self.params, self.options, self.shown = amqp_url(url, what, keys, required)
        try:
            self.connection = pika.BlockingConnection(self.params)
        except ERRORS as error:
            raise BrokerError(f"{self.shown}: cannot connect: {error!r}") from error
        try:
            self.channel = self.connection.channel()
        except ERRORS as error:
            self.close()
            raise BrokerError(f"{self.shown}: cannot open a channel: {error!r}") from error

    def keepalive(self) -> None:
        """Heartbeats while a batch runs (``base.KeptAlive``): pika's blocking connection
        sends and checks them only inside a call. On a source, deliveries that arrive
        meanwhile wait in its buffer for the next take."""
        try:
            self.connection.process_data_events(time_limit=0)
        except ERRORS as error:
            raise self.failed("cannot keep the connection alive", error) from error

    def failed(self, doing: str, error: BaseException) -> BrokerError:
        return BrokerError(f"{self.shown}: {doing}: {error!r}")

    def close(self) -> None:
        # Closing a connection the broker has already dropped raises; it is closed either way.
        try:
            if self.connection.is_open:
                self.connection.close()
        except ERRORS:
            pass
