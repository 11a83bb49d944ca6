"""Parsers of a stream worker's ends: ``SERVING_STREAM_SOURCE``, ``_SINK`` and
``_DEAD_LETTER``, each a broker URL whose query names the queue, stream or exchange.

    amqp://USER:PASS@HOST:PORT/VHOST?queue=NAME                     a source
    amqp://USER:PASS@HOST:PORT/VHOST?exchange=NAME&routing_key=KEY  a sink
    redis://[:PASS@]HOST:PORT/DB?stream=NAME[&group=NAME]           a source
    redis://[:PASS@]HOST:PORT/DB?stream=NAME[&maxlen=N]             a sink

Checked here, before a model loads, so that a typo stops the process at once
naming the variable; the backends read the same query (``stream.backend``).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from serving_core.settings.addresses import masked
from serving_core.settings.parsers import Parser

AMQP = ("amqp", "amqps")
REDIS = ("redis", "rediss", "unix")
_SOURCE_EXAMPLE = "amqp://USER:PASS@HOST:5672/VHOST?queue=NAME or redis://HOST:6379/0?stream=NAME"
_SINK_EXAMPLE = (
    "amqp://USER:PASS@HOST:5672/VHOST?exchange=NAME&routing_key=KEY "
    "or redis://HOST:6379/0?stream=NAME"
)
_INTEGERS = ("maxlen", "claim_idle_ms")


def _query(name: str, raw: str, example: str) -> tuple[str, dict[str, str]]:
    url = urlsplit(raw)
    if url.scheme not in AMQP + REDIS or not raw.startswith(url.scheme + "://"):
        raise ValueError(f"{name}={masked(raw)!r} is not an amqp:// or redis:// URL; use {example}")
    try:
        url.port  # noqa: B018 (a port that is not a number, or past 65535, raises)
    except ValueError:
        raise ValueError(f"{name}={masked(raw)!r} has a port that is not 0..65535") from None
    query = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
    for key in _INTEGERS:
        if key in query and not query[key].isdigit():
            raise ValueError(f"{name}={masked(raw)!r}: {key}={query[key]!r} is not a whole number")
    return url.scheme, query


def _source(name: str, raw: str) -> str:
    scheme, query = _query(name, raw, _SOURCE_EXAMPLE)
    wanted = "queue" if scheme in AMQP else "stream"
    if not query.get(wanted):
        raise ValueError(
            f"{name}={masked(raw)!r} names no {wanted}; add ?{wanted}=NAME (e.g. {_SOURCE_EXAMPLE})"
        )
    return raw


def _sink(name: str, raw: str) -> str:
    scheme, query = _query(name, raw, _SINK_EXAMPLE)
    if scheme in AMQP:
        if "exchange" not in query or not query.get("routing_key"):
            raise ValueError(
                f"{name}={masked(raw)!r} needs ?exchange=NAME&routing_key=KEY "
                "(exchange= empty: the default exchange, routing_key the queue's name)"
            )
    elif not query.get("stream"):
        raise ValueError(f"{name}={masked(raw)!r} names no stream; add ?stream=NAME")
    return raw


STREAM_SOURCE = Parser(_source, "`amqp://…?queue=NAME` or `redis://…?stream=NAME[&group=NAME]`")
STREAM_SINK = Parser(
    _sink, "`amqp://…?exchange=NAME&routing_key=KEY` or `redis://…?stream=NAME[&maxlen=N]`"
)
