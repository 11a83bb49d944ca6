"""A Redis URL's rules, as redis-py applies them when it first connects: the cache's
store (``cache/redisstore.py``) and the job queue's backend (``jobs/redis/backend.py``)
both check theirs here, at start-up, before a model loads."""

from __future__ import annotations

from urllib.parse import urlsplit

SCHEMES = ("redis", "rediss", "unix")
EXAMPLES = "redis://HOST:6379/0, rediss://… (TLS) or unix:///path/redis.sock"


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
    return None
