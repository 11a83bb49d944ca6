"""One request waiting for the model thread, and how its future is settled."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from serving_core.context import Context


@dataclass(eq=False)
class Pending:
    """One request waiting for the model thread."""

    item: Any
    context: Context  # its id, and the monotonic deadline after which the answer is useless
    arrival: float  # monotonic seconds, when the request reached the server
    enqueued: float = 0.0
    future: Future[Any] = field(default_factory=Future)
    batch_size: int = 0  # the size of the batch that ran it, once it ran (for the log)
    started: float = 0.0  # monotonic seconds, when that batch began (its queue span's end)
    batch_span: str | None = None  # that batch's ``model`` span (a ``traceparent``), traced
    gone: bool = False  # its client hung up: dropped unrun at the next sweep or take
    # Asks the client's connection, now, whether it has hung up (the gevent
    # worker's peek; ``WaitQueue.peek`` calls it before refusing anyone).
    client_gone: Callable[[], bool] = field(default=lambda: False, repr=False)

    @property
    def request_id(self) -> str:
        return self.context.request_id

    @property
    def deadline(self) -> float:
        return self.context.deadline if self.context.deadline is not None else float("inf")


def resolve(future: Future[Any], result: Any) -> None:
    """Set a result or an exception, unless the future is done already (failed by
    ``Batcher.abandon`` while the model thread was away)."""
    if future.done():
        return
    with contextlib.suppress(InvalidStateError):
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
