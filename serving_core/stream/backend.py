"""The choice of a stream's ends by URL scheme: redis:// (Redis Streams) or amqp://
(RabbitMQ). A broker's client library is imported only when its scheme is used.

It sits above the backends, which import the types in ``stream.base`` and never
this module. Another broker (Kafka, say) is one more scheme here.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from serving_core.stream.base import Sink, Source

REDIS = ("redis", "rediss", "unix")
AMQP = ("amqp", "amqps")


def open_source(url: str, batch_size: int, consumer_name: str) -> Source:
    """SERVING_STREAM_SOURCE's reader; ``batch_size``: what one take asks for at most
    (XREADGROUP's COUNT; AMQP's prefetch is three times it)."""
    scheme = _scheme(url, "SERVING_STREAM_SOURCE")
    if scheme in REDIS:
        from serving_core.stream.redis_streams import RedisSource

        return RedisSource(url, batch_size=batch_size, consumer=consumer_name)
    from serving_core.stream.amqp import AmqpSource

    return AmqpSource(url, batch_size=batch_size, consumer=consumer_name)


def open_sink(url: str, setting: str = "SERVING_STREAM_SINK") -> Sink:
    """A sink for results (or dead letters: ``setting`` names the variable in errors)."""
    scheme = _scheme(url, setting)
    if scheme in REDIS:
        from serving_core.stream.redis_streams import RedisSink

        return RedisSink(url)
    from serving_core.stream.amqp import AmqpSink

    return AmqpSink(url)


def _scheme(url: str, setting: str) -> str:
    scheme = urlsplit(url).scheme
    if not url:
        raise ValueError(f"{setting} is not set; serving-core stream needs it (a broker URL)")
    if scheme not in REDIS + AMQP:
        raise ValueError(
            f"{setting}: {scheme or url!r} is not a broker serving-core streams with; "
            "use an amqp:// (RabbitMQ) or redis:// (Redis Streams) URL"
        )
    return scheme
