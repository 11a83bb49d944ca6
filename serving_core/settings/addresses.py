"""Parsers of the settings that name places: the bind address, the cache's Redis URL, the
job queue's URL, CORS origins, trusted proxies. Each raises ``ValueError`` naming the
variable and what it accepts.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from serving_core.settings.parsers import Parser


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

_REDIS_EXAMPLES = "redis://HOST:6379/0, rediss://… (TLS) or unix:///path/redis.sock"


def masked(raw: str) -> str:
    """The URL as an error may quote it: without its password."""
    scheme, sep, rest = raw.partition("://")
    userinfo, at, host = rest.rpartition("@")  # the last @: a password may hold one
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{sep}{user}:***@{host}" if at and colon else raw


def _redis_fault(raw: str) -> str | None:
    """Why redis-py would refuse ``raw`` when it first connects, or None."""
    url = urlsplit(raw)
    if url.scheme not in ("redis", "rediss", "unix") or not raw.startswith(url.scheme + "://"):
        return "is not a Redis URL"
    if url.scheme == "unix" and not url.path:
        return "names no socket path"
    try:
        url.port  # noqa: B018 (a port that is not a number, or past 65535, raises)
    except ValueError:
        return "has a port that is not 0..65535"
    return None


def _cache_url(name: str, raw: str) -> str:
    fault = _redis_fault(raw)
    if fault:
        raise ValueError(
            f"{name}={masked(raw)!r} {fault}; use {_REDIS_EXAMPLES}, "
            "or leave it empty for each worker's memory"
        )
    return raw


def _jobs_url(name: str, raw: str) -> str:
    # Which schemes there are, and what each takes, is the job backends' to say
    # (serving_core/jobs/backends.py), checked when a command opens the queue.
    if not _URL.fullmatch(raw):
        raise ValueError(
            f"{name}={masked(raw)!r} is not a URL; use SCHEME://..., e.g. "
            "redis://HOST:6379/0, or leave it empty for the SQLite file at SERVING_JOBS_PATH"
        )
    return raw


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://.*", re.DOTALL)
_REDIS_ACCEPTS = "empty, or a `redis://`, `rediss://` or `unix://` URL"
CACHE_URL = Parser(_cache_url, _REDIS_ACCEPTS)
# The schemes of jobs/backends.py's table (tests/jobs/test_backends.py compares them).
JOBS_URL = Parser(
    _jobs_url,
    "empty, or a job queue backend's `sqlite://`, `redis://`, `rediss://` or `unix://` URL",
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
