"""How a verb fails: one line on stderr that says what to fix, and an exit status."""

from __future__ import annotations

EXIT_CONFIG = 2  # a bad setting or a broken handler: nothing was served
EXIT_PREDICT = 1  # the handler loaded but its sample failed


class Failure(Exception):
    """A verb stops; ``cli.main`` prints ``serving-core: error: MESSAGE`` and exits with
    ``status``."""

    def __init__(self, message: str, status: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.status = status
