"""An AMQP URL of SERVING_STREAM_SOURCE, _SINK or _DEAD_LETTER: pika's connection
parameters, and the query parameters that are the stream's own."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pika


def shown(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def amqp_url(
    url: str, what: str, keys: Iterable[str], required: Iterable[str]
) -> tuple[pika.URLParameters, dict[str, str], str]:
    """(pika's parameters, the stream's own parameters among ``keys``, the URL to show).

    Raises ValueError saying what to fix."""
    keys = list(keys)
    example = "amqp://USER:PASS@HOST:PORT/VHOST?" + "&".join(f"{k}=NAME" for k in keys)
    safe = shown(url)
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
