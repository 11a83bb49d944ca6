"""One worker's online path: the engine behind a batcher, with admission and deadlines.

``prepare`` and ``finish`` (validation, pre- and postprocessing) run where the
request runs; the model call runs on the worker's model thread, which the
batcher feeds. ``start`` runs after fork (it starts that thread) and takes
what only the worker knows: how many connections it holds and what a waiting
request waits on. ``stop`` runs at worker exit. Imports no Flask.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from .batching import Batcher, Observer
from .context import Context
from .dispatch import make_policy
from .engine import Engine
from .errors import DeadlineExceeded, NotReady
from .handler import Output, Params
from .loading import LoadedHandler
from .settings import Settings

log = logging.getLogger("serving_core.service")


class Service:
    def __init__(
        self,
        settings: Settings,
        loaded: LoadedHandler,
        engine: Engine,
        *,
        observer: Observer | None = None,
    ) -> None:
        self.settings = settings
        self.loaded = loaded
        self.engine = engine
        self.handler = loaded.handler
        self.name = engine.name
        self.batched = engine.batched
        self.max_batch_size = engine.max_batch_size
        self._observer = observer
        self.batcher: Batcher | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(
        self,
        *,
        warm_up: bool = True,
        open_connections: Callable[[], int | None] = lambda: None,
        new_future: Callable[[], Future[Any]] = Future,
    ) -> None:
        """Per-worker start: ``setup_worker``, the model thread, then the sample as warm-up.

        ``open_connections``: the worker's open client connections (each may still
        send a request), for the adaptive policy; ``new_future``: what a waiting
        request waits on (the gevent worker's greenlet-friendly future).
        """
        self.handler.setup_worker()
        policy = make_policy(
            self.settings.batch_policy,
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.settings.max_wait_ms if self.batched else 0.0,
            open_connections=open_connections,
        )
        self.batcher = Batcher(
            self.engine.run,
            policy=policy,
            max_batch_size=self.max_batch_size,
            max_queue=self.settings.max_queue,
            observer=self._observer,
        )
        self.batcher.new_future = new_future
        self.batcher.start()
        if warm_up and self.loaded.sample is not None:
            # Runs in the worker after fork: the first real request does not pay
            # for lazy initialisation, and a handler that breaks the contract
            # stops the worker at boot instead of failing requests.
            self.predict(dict(self.loaded.sample), request_id="warm-up")
            policy.cost.reset()

    def stop(self) -> bool:
        if self.batcher is None:
            return True
        return self.batcher.stop(self.settings.graceful_timeout_s)

    @property
    def ready(self) -> bool:
        return self.batcher is not None and self.batcher.alive

    # -- requests -----------------------------------------------------------

    def predict(
        self,
        params: Params,
        *,
        request_id: str,
        arrival: float | None = None,
        timeout_s: float | None = None,
    ) -> Output:
        """Prepare, batch, finish; raises ``ServingError`` subclasses."""
        if self.batcher is None:
            raise NotReady("the model is not loaded yet; retry after /readyz answers 200")
        now = time.monotonic()
        arrival = now if arrival is None else arrival
        limit = self.settings.request_timeout_s
        deadline = arrival + (limit if timeout_s is None else min(timeout_s, limit))
        if deadline <= now:
            self.batcher.rejected("deadline_passed")
            raise DeadlineExceeded(
                f"the request waited {now - arrival:.3f} s before reaching the app (in a proxy "
                "or the server's connection queue), past its deadline; retry later"
            )
        ctx = Context(request_id, deadline)
        item = self.engine.prepare(params, ctx)
        pending = self.batcher.submit(item, ctx, arrival=arrival)
        try:
            output = pending.future.result(timeout=max(0.0, deadline - time.monotonic()))
        except (FutureTimeout, CancelledError):
            pending.future.cancel()  # frees its slot if the model thread has not taken it
            raise DeadlineExceeded(
                f"no answer within the deadline of {deadline - arrival:.3f} s; "
                "retry later or ask for a longer timeout"
            ) from None
        return self.engine.finish(output, params, ctx)

    def metadata(self) -> dict[str, Any]:
        batching: dict[str, Any] = {
            "batched": self.batched,
            "max_batch_size": self.max_batch_size,
            "max_queue": self.settings.max_queue,
            "request_timeout_s": self.settings.request_timeout_s,
        }
        if self.batcher is not None:
            batching.update(self.batcher.policy.describe())
            batching["queue_depth"] = self.batcher.depth
        return {
            "name": self.name,
            "version": self.handler.version,
            "handler": self.loaded.source,
            "input_schema": self.handler.input_schema,
            "batching": batching,
            "workers": self.settings.workers,
            "worker_class": self.settings.worker_class,
            "worker_connections": self.settings.worker_connections,
            "threads": self.settings.threads,
        }
