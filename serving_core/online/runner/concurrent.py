"""A concurrent handler (a pipeline): ``predict`` runs in the request itself.

No model thread and no queue: each request calls the handler where it runs,
at most ``SERVING_MAX_QUEUE`` of them at once in this worker. Nor is the
sample run at start: a pipeline's stages may start after it does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.engine.observer import Observer
from serving_core.engine.watchdog import Watched
from serving_core.errors import NotReady, Overloaded, ServingError
from serving_core.online.runner.base import Computed, WatchGone


class ConcurrentRunner:
    started = False
    fault = None
    model_thread: Watched | None = None

    def __init__(self, engine: Engine, *, max_queue: int, observer: Observer | None) -> None:
        self._engine = engine
        self._max_queue = max_queue
        self._observer = observer
        self._in_flight = 0
        self._lock = threading.Lock()  # held for a count, never across a yield
        self._serving = False

    def start(self, warm_up: Callable[[], object] | None) -> None:
        self.started = self._serving = True

    def stop(self, timeout_s: float) -> bool:
        self._serving = False
        return True

    def admit(self, deadline: float) -> None:
        self._check()

    def run(self, item: Any, ctx: Context, *, arrival: float, watch: WatchGone | None) -> Computed:
        with self._lock:
            self._check()
            self._in_flight += 1
        try:
            (result,) = self._engine.run([item], [ctx]).results
        finally:
            with self._lock:
                self._in_flight -= 1
        if isinstance(result, ServingError):
            raise result
        # Run in the request, alone: no batch for the access line to tell of.
        return Computed(result, None)

    def _check(self) -> None:
        if not self._serving:
            raise NotReady("this worker is stopping; retry, another one serves it")
        if self._in_flight >= self._max_queue:
            if self._observer is not None:
                self._observer.rejected("queue_full")
            raise Overloaded(
                f"{self._in_flight} requests are in flight in this worker "
                f"(SERVING_MAX_QUEUE={self._max_queue}); retry after the Retry-After delay",
                reason="queue_full",
                retry_after_s=1.0,
            )

    @property
    def ready(self) -> bool:
        return self._serving

    def describe(self) -> dict[str, Any]:
        return {}
