"""A Redis URL's rules, as redis-py applies them when it first connects: the cache's
store (``cache/redisstore.py``) and the job queue's backend (``jobs/redis/backend.py``)
both check theirs here, at start-up, before a model loads."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

SCHEMES = ("redis", "rediss", "unix")
EXAMPLES = "redis://HOST:6379/0, rediss://… (TLS) or unix:///path/redis.sock"
# The query parameters redis-py reads as numbers (its URL_QUERY_ARGUMENT_PARSERS):
# one that is not refuses the URL with a message that names no setting.
_NUMBERS = {
    "db": int,
    "socket_read_size": int,
    "max_connections": int,
    "health_check_interval": int,
    "ssl_min_version": int,
    "protocol": int,
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "timeout": float,
}


def redis_fault(url: str) -> str | None:
    """Why redis-py would refuse ``url``, as words that follow the URL, or None."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not url.startswith(parts.scheme + "://"):
        return "is not a Redis URL"
    if parts.scheme == "unix" and not parts.path:
        return "names no socket path"
    try:
        parts.port  # noqa: B018 (a port that is not a number, or past 65535, raises)
    except ValueError:
        return "has a port that is not 0..65535"
    for name, values in parse_qs(parts.query).items():
        number = _NUMBERS.get(name)
        if number is not None:
            try:
                number(values[0])
            except ValueError:
                kind = "whole number" if number is int else "number"
                return f"has ?{name}={values[0]!r}, which is not a {kind}"
    return None
