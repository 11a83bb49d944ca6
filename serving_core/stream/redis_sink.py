"""Redis Streams' sink (``RedisSink``): results, or dead letters, by XADD
(``stream.redis_streams`` is the broker's module)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serving_core.stream.base import BrokerError, Outgoing, Refused
from serving_core.stream.redis_connection import RedisClient
from serving_core.stream.redis_replies import Deferred

MAX_BULK_BYTES = 512 * 1024 * 1024  # Redis' default proto-max-bulk-len


class RedisSink:
    """XADD of every result in one write (``send``); the replies, read after the
    consumer's next batch (``confirm``), are the confirmation (``redis_replies``).

    An entry with a field longer than the server's ``proto-max-bulk-len`` is not
    sent: Redis would answer it by closing the connection, the entries written
    after it with it. ``confirm`` raises ``Refused`` for it instead."""

    def __init__(self, url: str) -> None:
        self.redis = RedisClient(url, "a Redis Streams sink")
        self.stream = self.redis.stream
        maxlen = self.redis.query.get("maxlen")
        self.maxlen = int(maxlen) if maxlen else None
        self._replies = Deferred(self.redis.client, self.redis.call)
        self._refused: list[tuple[Outgoing, str]] = []
        self.max_field_bytes = 0  # read at the first send: opening connects to nothing

    def _max_field_bytes(self) -> int:
        """The server's ``proto-max-bulk-len``: its default where CONFIG is refused (a
        managed Redis may rename or forbid it)."""
        import redis

        try:
            said = self.redis.client.config_get("proto-max-bulk-len")
            return int(said.get("proto-max-bulk-len") or MAX_BULK_BYTES)
        except redis.ResponseError:
            return MAX_BULK_BYTES
        except (redis.RedisError, OSError) as error:
            raise BrokerError(f"Redis stream {self.stream!r}: {error}") from error

    def send(self, messages: Sequence[Outgoing]) -> None:
        if not self.max_field_bytes:
            self.max_field_bytes = self._max_field_bytes()
        trim = ["MAXLEN", "~", self.maxlen] if self.maxlen else []
        commands = []
        for message in messages:
            fields: list[Any] = []
            for key, value in {**message.headers, "id": message.id, "body": message.body}.items():
                fields += [key, value]
            if (longest := max(map(_length, fields))) > self.max_field_bytes:
                self._refused.append((message, f"a field of {longest} bytes"))
                continue
            commands.append(["XADD", self.stream, *trim, "*", *fields])
        if commands:
            self._replies.write(commands)

    def confirm(self) -> None:
        self._replies.read()
        refused, self._refused = self._refused, []
        if refused:
            sizes = ", ".join(f"{message.id!r} ({why})" for message, why in refused[:5])
            raise Refused(
                f"Redis stream {self.stream!r}: an entry's fields may be at most "
                f"{self.max_field_bytes} bytes (the server's proto-max-bulk-len): {sizes}",
                [message for message, _ in refused],
            )

    def publish(self, messages: Sequence[Outgoing]) -> None:
        self.send(messages)
        self.confirm()

    def close(self) -> None:
        self._replies.drop()
        self.redis.close()


def _length(value: object) -> int:
    return len(value) if isinstance(value, bytes) else len(str(value).encode())
