"""A test-only broker, ``toy:///DIR``: a directory of JSON files is the queue.

tests/stream/test_extension.py copies it into a scratch copy of the package as
``serving_core/stream/toy.py`` and adds its one line to ``stream.brokers.BROKERS``,
as a real broker (Kafka, say) would be added. Each message is a file
``ID.json`` holding ``{"id", "body", "headers"}``; a source takes the files it
has not taken yet, in name order, and acks a message by deleting its file; a
sink writes a file per message (written whole, then renamed into place, so a
reader never sees half of one). One consumer per source directory.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from serving_core.settings.secrets import masked
from serving_core.stream.base import Message, Outgoing

POLL_S = 0.02  # how often an empty source looks again (the broker's own wait)


def check_source(url: str) -> None:
    _directory(url)


def check_sink(url: str) -> None:
    _directory(url)


def open_source(url: str, batch_size: int, consumer: str) -> ToySource:
    return ToySource(_directory(url))


def open_sink(url: str) -> ToySink:
    return ToySink(_directory(url))


def _directory(url: str) -> Path:
    parts = urlsplit(url)
    if parts.scheme != "toy" or not parts.path.startswith("/"):
        raise ValueError(f"{masked(url)!r} names no directory; use toy:///ABSOLUTE/DIR")
    return Path(parts.path)


class ToySource:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._taken: set[Path] = set()

    def _waiting(self) -> list[Path]:
        return [p for p in sorted(self.directory.glob("*.json")) if p not in self._taken]

    def take(self, max_n: int, wait_s: float) -> list[Message]:
        deadline = time.monotonic() + wait_s
        while not (waiting := self._waiting()) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        messages = []
        for path in waiting[:max_n]:
            record = json.loads(path.read_text())
            self._taken.add(path)
            body = record["body"].encode()
            messages.append(Message(record["id"], body, record["headers"], tag=path))
        return messages

    def ack(self, messages: Sequence[Message]) -> None:
        for message in messages:
            assert isinstance(message.tag, Path)
            message.tag.unlink(missing_ok=True)
            self._taken.discard(message.tag)

    def lag(self) -> int | None:
        return len(self._waiting())

    def close(self) -> None:
        pass


class ToySink:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def send(self, messages: Sequence[Outgoing]) -> None:
        for message in messages:
            record = {"id": message.id, "body": message.body.decode(), "headers": message.headers}
            part = self.directory / f".{message.id}.part"
            part.write_text(json.dumps(record))
            os.replace(part, self.directory / f"{message.id}.json")

    def confirm(self) -> None:
        pass

    def publish(self, messages: Sequence[Outgoing]) -> None:
        self.send(messages)
        self.confirm()

    def close(self) -> None:
        pass
