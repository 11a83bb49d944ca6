"""A Kafka end's URL (SERVING_STREAM_SOURCE, _SINK or _DEAD_LETTER): its topic, its
consumer group, and the librdkafka configuration it stands for.

    kafka[s]://[USER:PASS@]HOST:PORT[,HOST:PORT...]/TOPIC[?group=NAME][&PROPERTY=VALUE...]

``kafkas://`` is TLS (``security.protocol=SSL``); a user and password add SASL
(``SASL_SSL`` or ``SASL_PLAINTEXT``, mechanism ``PLAIN`` unless
``sasl.mechanism=`` says ``SCRAM-SHA-512`` ...). Every other query parameter is a
librdkafka property, as its CONFIGURATION.md names it (``session.timeout.ms=``,
``ssl.ca.location=``, ``sasl.password=`` ...), which is why the URL is the one
place a Kafka user looks: no property of theirs needs a setting of ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

from serving_core.settings.secrets import masked

SCHEMES = ("kafka", "kafkas")
EXAMPLE = "kafka://HOST:9092[,HOST:9092]/TOPIC"
DEFAULT_GROUP = "serving-core"
# The query keys that are ours, not librdkafka's.
OURS = ("group",)
# A topic name as Kafka takes it (legal characters, at most 249 of them).
TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
SERVER = re.compile(r"[^\s,:/]+:[0-9]{1,5}")
PROPERTY = re.compile(r"[a-z][a-z0-9_.]*")
# What the URL decides: a query parameter may not say otherwise.
FIXED = {
    "bootstrap.servers": "the URL's host:port list",
    "group.id": "group=",
    "enable.auto.commit": "the consumer commits once results are confirmed",
    "enable.auto.offset.store": "the consumer commits once results are confirmed",
    "transactional.id": "the stream commits by offsets, not transactions",
}


@dataclass(frozen=True)
class KafkaUrl:
    """A Kafka end, parsed: ``config`` is librdkafka's, ``shown`` the masked URL."""

    topic: str
    group: str
    config: dict[str, Any]
    shown: str


def check(url: str, what: str) -> KafkaUrl:
    """``parse``, then librdkafka's own check of the properties, once, at start-up.
    Connects to nothing: librdkafka checks them without a broker."""
    end = parse(url, what)
    _validate(end.config, repr(end.shown), what)
    return end


def parse(url: str, what: str) -> KafkaUrl:
    """The end ``url`` names; ``ValueError`` (starting with the masked URL) saying what to
    fix."""
    shown = repr(masked(url))
    scheme, sep, rest = url.partition("://")
    if scheme not in SCHEMES or not sep:
        raise ValueError(f"{shown}: {what} is {EXAMPLE} (kafkas:// for TLS)")
    rest, _, query = rest.partition("?")
    authority, _, path = rest.partition("/")
    userinfo, at, hosts = authority.rpartition("@")
    servers = hosts.split(",")
    if not hosts or not all(SERVER.fullmatch(server) for server in servers):
        raise ValueError(
            f"{shown} names no brokers as HOST:PORT[,HOST:PORT...]; {what} is {EXAMPLE}"
        )
    topic = unquote(path)
    if not TOPIC.fullmatch(topic):
        raise ValueError(
            f"{shown}: {topic!r} is not a topic name (letters, digits, '.', '_', '-'; at "
            f"most 249); {what} is {EXAMPLE}"
        )
    config: dict[str, Any] = {"bootstrap.servers": ",".join(servers)}
    config.update(_security(scheme == "kafkas", userinfo if at else None, shown))
    group, properties = _query(query, shown, what)
    config.update(properties)
    return KafkaUrl(topic, group, config, masked(url))


def _security(tls: bool, userinfo: str | None, shown: str) -> dict[str, str]:
    """librdkafka's security properties for the scheme and the user info."""
    if userinfo is None:
        return {"security.protocol": "SSL"} if tls else {}
    user, colon, password = userinfo.partition(":")
    if not user or not colon:
        raise ValueError(f"{shown}: the user info is USER:PASS@ (SASL); give both")
    return {
        "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": unquote(user),
        "sasl.password": unquote(password),
    }


def _query(query: str, shown: str, what: str) -> tuple[str, dict[str, str]]:
    """(the consumer group, librdkafka's properties) of the URL's query."""
    group = DEFAULT_GROUP
    properties: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as error:
        raise ValueError(f"{shown}: the query is not KEY=VALUE&... ({error})") from None
    seen: set[str] = set()
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"{shown}: {key}= is given twice; {what} takes one")
        seen.add(key)
        if key == "group":
            if not value:
                raise ValueError(f"{shown}: group= is empty; name the consumer group")
            group = value
        elif key in FIXED:
            raise ValueError(f"{shown}: {key}= is set by {FIXED[key]}; leave it out")
        elif not PROPERTY.fullmatch(key):
            raise ValueError(
                f"{shown}: {key!r} is not a librdkafka property; besides group= {what} takes "
                "librdkafka's (session.timeout.ms=, sasl.mechanism=, ssl.ca.location=, ...)"
            )
        else:
            properties[key] = value
    return group, properties


def _validate(config: dict[str, Any], shown: str, what: str) -> None:
    """librdkafka's own check of the properties and their values, on a client given no
    broker to reach: an unknown property, or a bad value, stops start-up here rather
    than failing every reconnection later."""
    from confluent_kafka import KafkaException, Producer

    # log_level 0: a client without brokers would otherwise warn that it has none, and
    # a consumer's properties on this producer that it ignores them.
    trial = {key: value for key, value in config.items() if key != "bootstrap.servers"}
    try:
        Producer({**trial, "log_level": 0})
    except (KafkaException, ValueError, TypeError) as error:
        reason = error.args[0].str() if isinstance(error, KafkaException) else str(error)
        raise ValueError(
            f"{shown}: librdkafka refuses the URL's properties ({reason}); {what}'s query "
            "takes librdkafka's configuration properties (its CONFIGURATION.md)"
        ) from None
