"""The brokers ``serving-core stream`` reads and publishes through, by URL scheme.

``BROKERS`` maps a scheme to the module of its broker, imported only when a URL
of that scheme is used (so a Redis user never imports pika). A broker's module
has the functions of ``Broker``: it checks its own URLs and opens its ends.
Another broker is one module and one line here (docs/architecture.md, "Adding a
broker"); the chart's schema and KEDA triggers are checked against this table
(tests/deploy/test_chart_schemes.py).
"""

from __future__ import annotations

import importlib
from typing import Protocol, cast

from serving_core.settings.secrets import masked
from serving_core.stream.base import MessageSink, MessageSource

BROKERS: dict[str, str] = {
    "amqp": "serving_core.stream.amqp",  # RabbitMQ
    "amqps": "serving_core.stream.amqp",
    "redis": "serving_core.stream.redis_streams",  # Redis Streams
    "rediss": "serving_core.stream.redis_streams",
    "unix": "serving_core.stream.redis_streams",
    "kafka": "serving_core.stream.kafka",  # Kafka (confluent-kafka)
    "kafkas": "serving_core.stream.kafka",
}

# Each scheme's ``messaging.system``, as OpenTelemetry's messaging spans name it.
SYSTEMS: dict[str, str] = {
    "amqp": "rabbitmq",
    "amqps": "rabbitmq",
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "kafka": "kafka",
    "kafkas": "kafka",
}

SOURCE = "SERVING_STREAM_SOURCE"
SINK = "SERVING_STREAM_SINK"
DEAD_LETTER = "SERVING_STREAM_DEAD_LETTER"


class Broker(Protocol):
    """What a module of ``BROKERS`` provides. A check raises ``ValueError`` saying what
    is wrong with the URL and how to fix it, starting with the URL ``masked`` and
    quoted (``repr``), which ``check`` here prefixes with the variable; it connects
    to nothing, so it runs before a model loads."""

    def check_source(self, url: str) -> None: ...

    def check_sink(self, url: str) -> None: ...

    def open_source(self, url: str, batch_size: int, consumer: str) -> MessageSource:
        """``batch_size``: what one take asks for at most; ``consumer``: this
        process's name, unique among the consumers of the source."""
        ...

    def open_sink(self, url: str) -> MessageSink: ...


def broker(url: str, variable: str) -> Broker:
    """The module of ``url``'s broker; ``ValueError`` naming ``variable`` if there is none."""
    if not url:
        raise ValueError(
            f"{variable} is not set; serving-core stream needs a source, a sink and a "
            "dead-letter destination (see docs/streams.md)"
        )
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in BROKERS:
        schemes = ", ".join(f"{known}://" for known in BROKERS)
        raise ValueError(
            f"{variable}={masked(url)!r}: {scheme + sep if sep else 'no scheme'} names no broker "
            f"serving-core streams with; use a URL of one of {schemes} (docs/streams.md)"
        )
    return cast(Broker, importlib.import_module(BROKERS[scheme]))


def check(source: str, sink: str, dead_letter: str) -> None:
    """Each end's URL, checked by its broker: ``ValueError`` naming the variable."""
    for variable, url in ((SOURCE, source), (SINK, sink), (DEAD_LETTER, dead_letter)):
        ends = broker(url, variable)
        try:
            if variable == SOURCE:
                ends.check_source(url)
            else:
                ends.check_sink(url)
        except ValueError as error:
            raise ValueError(f"{variable}={error}") from None


def system(url: str) -> str:
    """The broker's name on a message's span: ``messaging.system`` (a broker added
    without a line in ``SYSTEMS`` goes by its scheme)."""
    scheme = url.partition("://")[0]
    return SYSTEMS.get(scheme, scheme)


def open_source(url: str, batch_size: int, consumer: str) -> MessageSource:
    """SERVING_STREAM_SOURCE's reader."""
    return broker(url, SOURCE).open_source(url, batch_size, consumer)


def open_sink(url: str, variable: str = SINK) -> MessageSink:
    """A sink for results (or dead letters: ``variable`` names the setting in errors)."""
    return broker(url, variable).open_sink(url)
