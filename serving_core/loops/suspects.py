"""Which message kills its consumer: ``Suspects``, a count per message of the consumers
that died running it alone, kept where the next consumer finds it.

A message handed out again (``Message.deliveries`` > 1) was in hand when a
consumer died or lost its broker, with its batch-mates and whatever else that
consumer held: the broker's count cannot say which of them killed it. So each
such message runs alone, and is counted before it runs and uncounted once it
has: a count that stays is a consumer that died running it, and it alone. A
message whose count reaches its limit is dead-lettered unrun; its batch-mates
never are.

The counts are files in a directory the master makes for its consumers (a
consumer that dies takes its memory with it), one per message, named by a
digest of its id and body; a count is removed once its message is done with.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from pathlib import Path

from serving_core.stream.base import Message

log = logging.getLogger("serving_core.loops.suspects")


class Suspects:
    """Deaths per message, in ``directory`` (shared by a master's consumers), or in this
    process's memory where there is none (a loop run without a master)."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = Path(directory) if directory else None
        self._memory: dict[str, int] = {}

    def deaths(self, message: Message) -> int:
        """How many consumers died while running ``message`` alone."""
        key = _key(message)
        if self.directory is None:
            return self._memory.get(key, 0)
        try:
            return int((self.directory / key).read_text() or 0)
        except (OSError, ValueError):
            return 0

    def running(self, message: Message) -> None:
        """Counted before it runs alone, as if the consumer died of it; ``done`` undoes."""
        key, count = _key(message), self.deaths(message) + 1
        if self.directory is None:
            self._memory[key] = count
            return
        # Whole or not at all: a consumer killed mid-write leaves the old count.
        part = self.directory / f".{key}.{os.getpid()}"
        try:
            part.write_text(str(count))
            part.replace(self.directory / key)
        except OSError as error:  # uncounted: the broker's count still ends it (running)
            log.warning("cannot count message %r's run in %s: %s", message.id, part, error)

    def done(self, message: Message) -> None:
        """It ran (or was dead-lettered): its count is forgotten."""
        key = _key(message)
        if self.directory is None:
            self._memory.pop(key, None)
            return
        with contextlib.suppress(OSError):
            (self.directory / key).unlink()


def _key(message: Message) -> str:
    digest = hashlib.sha256(message.id.encode(errors="replace") + b"\0" + message.body)
    return digest.hexdigest()[:32]
