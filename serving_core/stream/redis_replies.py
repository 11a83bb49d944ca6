"""Redis commands written now, their replies read later, on a connection of their own.

With ``appendfsync always`` Redis answers a write only after its fsync, which
takes milliseconds. A stream consumer writes a batch's XADDs and its XACK, runs
the next batch, and only then reads the replies, so that the wait overlaps the
model instead of idling its core. redis-py's pipeline writes and reads in one
call, so this holds one of its connections and uses it directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from serving_core.stream.base import BrokerError

Step = Callable[[], None]


class Deferred:
    def __init__(self, client: Any, call: Callable[[Step], None]) -> None:
        """``client``: a redis.Redis, whose pool lends the connection; ``call`` runs a
        step and turns Redis' errors into ``BrokerError``."""
        self._client, self._call = client, call
        self._connection: Any = None  # redis-py's Connection (its methods are untyped)
        self.unread = 0  # commands written whose replies are not read yet

    def write(self, commands: list[list[Any]]) -> None:
        def send() -> None:
            if self._connection is None:
                self._connection = self._client.connection_pool.get_connection()
            self._connection.send_packed_command(self._connection.pack_commands(commands))
            self.unread += len(commands)

        self._guarded(send)

    def read(self) -> None:
        """Every reply still unread; an error reply raises (a ``BrokerError``)."""

        def receive() -> None:
            while self.unread:
                self._connection.read_response()
                self.unread -= 1

        self._guarded(receive)

    def close(self) -> None:
        """Reads what is unread (so that a stop's last XACK is done), then disconnects."""
        with contextlib.suppress(BrokerError):
            self.read()
        self.drop()

    def drop(self) -> None:
        """The connection and its unread replies, gone: after a failure, nothing read
        from it could be trusted to answer the command it seems to."""
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.disconnect()
            self._connection = None
        self.unread = 0

    def _guarded(self, step: Step) -> None:
        try:
            self._call(step)
        except BrokerError:
            self.drop()
            raise
