"""A real redis-server as a stream's broker, for tests/stream's end-to-end tests.

Append-only with an fsync per write, so that ``restart`` (SIGTERM, then a new
server on the same port and files) keeps the streams, the consumer group and
its pending entries, as a production Redis with persistence would.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from tests.redis_server import redis_server
from tests.servers import free_port

Item = tuple[str, bytes, dict[str, str]]  # (id, body, headers)
GROUP = "serving-core"
# Short, so that a killed consumer's entries are claimed within the test: a batch
# here takes milliseconds (a gated one stops only the consumer that holds it).
CLAIM_IDLE_MS = 2000


class RedisBroker:
    """Streams ``in`` (a consumer group's), ``out`` and ``dead`` on one redis-server."""

    counts_deliveries = True
    client_reconnects = False

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._server: contextlib.AbstractContextManager[str] | None = None
        self._port = free_port()
        base = f"redis://127.0.0.1:{self._port}/0"
        self.source_url = f"{base}?stream=in&group={GROUP}&claim_idle_ms={CLAIM_IDLE_MS}"
        self.sink_url = f"{base}?stream=out"
        self.dead_url = f"{base}?stream=dead"
        self._client = redis.Redis.from_url(base)

    def __enter__(self) -> RedisBroker:
        self._data = Path(self._stack.enter_context(tempfile.TemporaryDirectory()))
        self._start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()
        self._client.close()
        self._stack.close()

    def _start(self) -> None:
        options = ["--appendonly", "yes", "--appendfsync", "always"]
        self._server = redis_server(options=options, data_dir=self._data, port=self._port)
        self._server.__enter__()

    def _stop(self) -> None:
        if self._server is not None:
            self._server.__exit__(None, None, None)
            self._server = None

    def restart(self) -> None:
        self._stop()
        self._start()

    def produce(self, items: list[Item], *, one_batch: bool = False) -> None:
        pipe = self._client.pipeline(transaction=False)
        for message_id, body, headers in items:
            fields: dict[Any, Any] = {**headers, "id": message_id, "body": body}
            pipe.xadd("in", fields)
        pipe.execute()

    def results(self) -> list[Item]:
        return self._read("out")

    def dead(self) -> list[Item]:
        return self._read("dead")

    def lag(self) -> int:
        for group in self._client.xinfo_groups("in"):
            if group["name"] in (GROUP, GROUP.encode()):
                return int(group["pending"]) + int(group["lag"] or 0)
        raise AssertionError(f"no group {GROUP!r} on stream 'in'")

    def _read(self, stream: str) -> list[Item]:
        items = []
        for _, fields in self._client.xrange(stream):
            text = {k.decode(): v for k, v in fields.items()}
            body = text.pop("body")
            message_id = text.pop("id").decode()
            items.append((message_id, body, {k: v.decode() for k, v in text.items()}))
        return items
