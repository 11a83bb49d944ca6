"""In each worker: the shared model process (or processes) behind a batcher's interface."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from serving_core.context import Context
from serving_core.engine.observer import Observer
from serving_core.engine.pending import Pending
from serving_core.errors import NotReady, Overloaded
from serving_core.modelprocess.link import Link
from serving_core.modelprocess.protocol import Request
from serving_core.runtime import THREADS, Runtime


class SharedPolicy:
    """What ``/metadata`` shows of the batching when the model process batches."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)

    def describe(self) -> dict[str, Any]:
        return {"model_process": "shared", "model_processes": len(self.paths)}


class RemoteBatcher:
    """A worker's stand-in for its ``Batcher``: the same ``submit`` and futures, served
    by the shared model process (or processes: one per GPU) over one connection each,
    with many requests in flight on it. A request goes to the connected model process
    with the fewest of this worker's requests in flight."""

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        max_queue: int = 1 << 30,
        observer: Observer | None = None,
        open_connections: Callable[[], int | None] = lambda: None,
        runtime: Runtime = THREADS,
    ) -> None:
        paths = [paths] if isinstance(paths, str) else list(paths)
        self.runtime = runtime
        self.max_queue = max_queue
        self.policy = SharedPolicy(paths)
        self.fault: str | None = None  # a worker-side model thread's; never set here
        self._observer = observer
        self._open_connections = open_connections
        self._seq = itertools.count()
        self._stopping = False
        self._links = [Link(path, lambda: self._stopping, runtime) for path in paths]

    def start(self) -> None:
        for link in self._links:
            # Greenlets under gevent: the worker's sockets are gevent's, used on its hub.
            self.runtime.spawn(link.run)
            self.runtime.spawn(link.write)

    def wait_connected(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(
            link.connected.wait(max(0.0, deadline - time.monotonic())) for link in self._links
        )

    def admit(self, deadline: float) -> None:
        """What this worker can refuse before a request's body is read: no model
        process, or its own share of the queue (SERVING_MAX_QUEUE) in flight. The
        model process applies the rest of admission when the item arrives."""
        self._pick()

    def _pick(self) -> Link:
        up = [link for link in self._links if link.sock is not None]
        if not up or self._stopping:
            raise NotReady(
                "the shared model process is not up (starting, or restarting after a "
                "failure); retry after /readyz answers 200"
            )
        if self.depth >= self.max_queue:
            self.rejected("queue_full")
            raise Overloaded(
                f"{self.depth} requests of this worker are in the shared model "
                "process; retry after the Retry-After delay",
                reason="queue_full",
                retry_after_s=1.0,
            )
        return min(up, key=lambda link: len(link.pending))

    def withdraw(self, pending: Pending) -> None:
        """The request gave up at its deadline. Its item stays in the model process,
        which drops it unrun once the deadline has passed, and answers it anyway."""
        pending.future.cancel()

    def submit(self, item: Any, context: Context, *, arrival: float) -> Pending:
        link = self._pick()
        pending = Pending(
            item, context, arrival, enqueued=time.monotonic(), future=self.runtime.new_future()
        )
        request = Request(
            next(self._seq),
            context.request_id,
            context.deadline,
            arrival,
            item,
            self._open_connections(),
            context.traceparent,
        )
        link.send(request, pending)
        return pending

    def rejected(self, reason: str) -> None:
        if self._observer is not None:
            self._observer.rejected(reason)

    @property
    def alive(self) -> bool:
        """Ready while every model process is connected: one that is down turns this
        worker's /readyz red (the others still serve what reaches the worker)."""
        return not self._stopping and all(link.sock is not None for link in self._links)

    @property
    def depth(self) -> int:
        return sum(len(link.pending) for link in self._links)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Refuse new requests, wait for the answers in flight, close the connections."""
        self._stopping = True
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else 30.0)
        while self.depth and time.monotonic() < deadline:
            time.sleep(0.01)
        drained = not self.depth
        for link in self._links:
            link.close()
        return drained
