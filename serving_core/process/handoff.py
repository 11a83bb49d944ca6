"""What ``serve --reload`` (``reload``) hands each server it starts, and how a server
started so says that it is ready: the one thing of the reloader that ``serve`` knows.

The reloader passes the two file descriptors on the command line
(``serving-core serve --handoff LISTEN,READY``, a flag no user types): gunicorn
binds to the socket (its ``fd://`` bind), and each of the server's first workers
writes ``READY`` to the pipe once its warm-up passed.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

READY = b"r"  # a worker's word on the pipe: its warm-up passed


@dataclass(frozen=True)
class Handoff:
    """What the reloader hands each server it starts: the file descriptors of the
    listening socket and of the pipe its first workers write ``READY`` to."""

    listen_fd: int
    ready_fd: int

    def argument(self) -> str:
        return f"{self.listen_fd},{self.ready_fd}"

    @classmethod
    def parse(cls, text: str) -> Handoff:
        listen_fd, ready_fd = (int(part) for part in text.split(","))
        return cls(listen_fd, ready_fd)

    @property
    def bind(self) -> list[str]:
        """gunicorn's bind: the socket handed over, not SERVING_BIND."""
        return [f"fd://{self.listen_fd}"]

    def announce_ready(self) -> None:
        """In a worker whose warm-up passed. A reloader that has gone (its server is
        being stopped) leaves no reader: that is no reason to fail the worker."""
        with contextlib.suppress(OSError):
            os.write(self.ready_fd, READY)
