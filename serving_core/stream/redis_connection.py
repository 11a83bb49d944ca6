"""A Redis Streams end's URL and client (SERVING_STREAM_SOURCE, _SINK or _DEAD_LETTER):
the query keys that are the stream's own, what redis-py would refuse, and a client
whose every error is a ``BrokerError``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from serving_core.settings.secrets import masked
from serving_core.stream.base import BrokerError

if TYPE_CHECKING:
    import redis

COMMAND_TIMEOUT_S = 10.0  # connect, and every command but the blocking read
OURS = ("stream", "group", "maxlen", "claim_idle_ms")  # the query keys redis-py must not see
WHOLE_NUMBERS = ("maxlen", "claim_idle_ms")
SCHEMES = ("redis", "rediss", "unix")
EXAMPLE = "redis://[:PASS@]HOST:6379/DB?stream=NAME"
T = TypeVar("T")


def check_url(url: str, what: str) -> None:
    """What redis-py would refuse on its first connection, and a missing stream."""
    parts, shown = urlsplit(url), repr(masked(url))
    if parts.scheme not in SCHEMES or not url.startswith(parts.scheme + "://"):
        raise ValueError(f"{shown}: {what} is {EXAMPLE} (rediss:// for TLS, unix:///PATH)")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"{shown} names no socket path; use unix:///PATH?stream=NAME")
    try:
        parts.port  # noqa: B018 (a port that is not a number, or past 65535, raises)
    except ValueError:
        raise ValueError(f"{shown} has a port that is not 0..65535") from None
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if not query.get("stream"):
        raise ValueError(f"{shown} names no stream; add ?stream=NAME ({what} is {EXAMPLE})")
    for key in WHOLE_NUMBERS:
        if key in query and not query[key].isdigit():
            raise ValueError(f"{shown}: {key}={query[key]!r} is not a whole number")


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """The URL redis-py takes (without our query keys), and our keys' values."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {key: value for key, value in query if key in OURS}
    rest = urlencode([(key, value) for key, value in query if key not in OURS])
    # Joined by hand: urlunsplit drops the "//" of an empty host, and redis-py refuses
    # the "unix:/path" it makes of "unix:///path".
    base = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return base + (f"?{rest}" if rest else ""), ours


class RedisClient:
    """One client, and Redis' errors (and socket ones) turned into ``BrokerError``."""

    def __init__(self, url: str, what: str) -> None:
        import redis

        check_url(url, what)
        base, self.query = split_url(url)
        self.stream = self.query["stream"]
        self._errors = (redis.RedisError, OSError)
        # No retries of its own: a lost connection is a BrokerError, and the worker's
        # back-off, reconnection and redelivery handle every case the same way.
        self.client: redis.Redis = redis.Redis.from_url(
            base,
            socket_timeout=COMMAND_TIMEOUT_S,
            socket_connect_timeout=COMMAND_TIMEOUT_S,
            retry_on_timeout=False,
            retry=None,
        )

    def call(self, command: Callable[[], T]) -> T:
        try:
            return command()
        except self._errors as error:
            raise BrokerError(f"Redis stream {self.stream!r}: {error}") from error

    def close(self) -> None:
        with contextlib.suppress(*self._errors):
            self.client.close()


def text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
