"""A queue in front of the model: the request submits its item and waits on its future.

What the local and the shared runner share. The queue is the worker's own
``Batcher`` (its model thread) or a ``RemoteBatcher`` (the shared model
process); both admit, refuse and answer alike.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Any, Protocol

from serving_core.context import Context
from serving_core.engine.batcher import Batcher
from serving_core.engine.pending import Pending
from serving_core.engine.watchdog import Watched
from serving_core.errors import DeadlineExceeded
from serving_core.online.runner.base import Computed, WatchGone
from serving_core.tracing.tracer import tracer


class Describes(Protocol):
    def describe(self) -> dict[str, Any]: ...


class ModelQueue(Protocol):
    """What ``Batcher`` and ``RemoteBatcher`` both offer a request."""

    @property
    def policy(self) -> Describes: ...

    @property
    def fault(self) -> str | None: ...

    @property
    def alive(self) -> bool: ...

    @property
    def depth(self) -> int: ...

    def start(self) -> None: ...

    def stop(self, timeout_s: float | None = None) -> bool: ...

    def admit(self, deadline: float) -> None: ...

    def submit(self, item: Any, context: Context, *, arrival: float) -> Pending: ...

    def withdraw(self, pending: Pending) -> None: ...


class QueuedRunner:
    """A runner over a queue that feeds the model elsewhere (a thread, a process)."""

    model_thread: Watched | None = None

    def __init__(self, queue: ModelQueue) -> None:
        self.queue = queue
        self.started = False

    def start(self, warm_up: Callable[[], object] | None) -> None:
        self.started = True
        self.queue.start()

    def stop(self, timeout_s: float) -> bool:
        return self.queue.stop(timeout_s)

    def admit(self, deadline: float) -> None:
        self.queue.admit(deadline)

    def run(self, item: Any, ctx: Context, *, arrival: float, watch: WatchGone | None) -> Computed:
        queue = self.queue
        pending = queue.submit(item, ctx, arrival=arrival)
        # A client that hangs up: its item is marked, and dropped unrun before any
        # refusal (``Batcher.hung_up``); the shared model process's queue withdraws it.
        gone = partial(queue.hung_up if isinstance(queue, Batcher) else queue.withdraw, pending)
        watching = watch(gone) if watch is not None else None
        if watching is not None:
            pending.client_gone = watching.gone_now  # before anyone else can be refused
        try:
            output = pending.future.result(timeout=ctx.remaining_s())
        except (FutureTimeout, CancelledError):
            queue.withdraw(pending)  # frees its slot if the model has not taken it
            raise DeadlineExceeded(
                f"no answer within the deadline of {pending.deadline - arrival:.3f} s; "
                "retry later or ask for a longer timeout"
            ) from None
        finally:
            if watching is not None:
                watching.stop()
        traces = tracer()
        if traces.enabled and pending.started:
            # Drawn once the batch has run: from the queue to the model, linked to the batch.
            links = (pending.batch_span,)
            queued = traces.start("queue", links=links, at=pending.enqueued)
            queued.set("serving.batch_size", pending.batch_size)
            queued.end(at=pending.started)
        return Computed(output, pending.batch_size or None)

    @property
    def ready(self) -> bool:
        return self.queue.alive

    @property
    def fault(self) -> str | None:
        return self.queue.fault

    def describe(self) -> dict[str, Any]:
        return {**self.queue.policy.describe(), "queue_depth": self.queue.depth}
