"""Parsers of the settings that name places: the bind address, URLs, CORS origins,
trusted proxies. Each raises ``ValueError`` naming the variable and what it accepts.

A URL that picks a backend (a broker, a cache store, a job queue) is only checked here for
having a scheme: the backend its scheme picks checks the rest at start-up
(``stream.brokers``, ``cache.stores``, ``jobs.backends``), since the contract knows no backend.
"""

from __future__ import annotations

import ipaddress
import re

from serving_core.settings.parsers import Parser
from serving_core.settings.secrets import masked


def _bind(name: str, raw: str) -> str:
    if raw.startswith("unix:"):
        if len(raw) == len("unix:"):
            raise ValueError(f"{name}={raw!r} names no socket path; use unix:/run/serving/app.sock")
        return raw
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{name}={raw!r} is not HOST:PORT or unix:PATH; use e.g. 127.0.0.1:8000")
    return raw


BIND = Parser(_bind, "`HOST:PORT` or `unix:PATH`")

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def url(accepts: str, empty: str) -> Parser[str]:
    """Empty, or ``SCHEME://…``; ``accepts`` says which, in the settings reference, and
    ``empty`` what an empty one means."""

    def parse(name: str, raw: str) -> str:
        if raw and not _SCHEME.match(raw):
            raise ValueError(
                f"{name}={masked(raw)!r} is not a URL; use SCHEME://… (docs/settings.md "
                f"says which), or leave it empty for {empty}"
            )
        return raw

    return Parser(parse, accepts)


# Which backends, and what each URL names, are the backends' own (docs/jobs.md).
JOBS_URL = url(
    "empty, or a job queue backend's URL ([the queues](jobs.md#the-queues))",
    empty="the SQLite file at SERVING_JOBS_PATH",
)
CACHE_URL = url("empty, or a store's URL, e.g. `redis://HOST:6379/0`", empty="each worker's memory")
# Which brokers, and what each URL names, are the brokers' own (docs/streams.md).
BROKER_URL = url(
    "empty, or a broker's URL ([the URLs](streams.md#the-urls))",
    empty="the commands other than serving-core stream",
)


def _model_uri(name: str, raw: str) -> str:
    # A local path is a URI too: baked-in weights (the image's MODEL_DIR) are used in place.
    if raw and not raw.startswith("/") and not _SCHEME.match(raw):
        raise ValueError(
            f"{name}={masked(raw)!r} is neither a URL nor an absolute path; use e.g. "
            "s3://bucket/models/NAME/, https://host/models/NAME/ or /models/NAME"
        )
    return raw


# Which stores, and what each URI names, are serving_core.artifacts' own (docs/artifacts.md).
MODEL_URI = Parser(
    _model_uri,
    "empty, an absolute path, or a store's URL ([the stores](artifacts.md#the-stores))",
)


_ORIGIN = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")


def _origins(name: str, raw: str) -> tuple[str, ...]:
    origins = tuple(origin.strip() for origin in raw.split(",") if origin.strip())
    if "*" in origins and len(origins) > 1:
        raise ValueError(f"{name}={raw!r} mixes * with origins; use * alone, or origins alone")
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ValueError(
                f"{name} holds {origin!r}, which is not an origin; use scheme://host[:port] "
                "with no path or trailing slash, e.g. https://app.example.com, or *"
            )
    return origins


ORIGINS = Parser(_origins, "comma-separated `scheme://host[:port]` origins, or `*`")


def _proxies(name: str, raw: str) -> tuple[str, ...]:
    entries = tuple(entry.strip() for entry in raw.split(",") if entry.strip())
    if "*" in entries:
        if len(entries) > 1:
            raise ValueError(f"{name}={raw!r} mixes * with addresses; use * alone")
        return entries
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(
                f"{name} holds {entry!r}, which is not an IP address or CIDR; use e.g. "
                "127.0.0.1,10.0.0.0/8 (the addresses your proxy connects from), or *"
            ) from None
    return entries


PROXIES = Parser(_proxies, "comma-separated IP addresses or CIDRs, or `*`")
# Which sinks, and what each URL names, are serving_core.payloads' own (docs/observability.md).
PAYLOAD_LOG_URL = url(
    "empty, or an `http(s)://` endpoint or a broker's URL "
    "([payload logging](observability.md#payload-logging))",
    empty="no payload logging",
)
