"""The worker's own model thread, fed by its batcher: the default runner."""

from __future__ import annotations

from collections.abc import Callable

from serving_core.engine.batcher import Batcher
from serving_core.engine.engine import Engine
from serving_core.engine.observer import Observer
from serving_core.engine.policy import policy_for
from serving_core.online.runner.queued import QueuedRunner
from serving_core.runtime import Runtime
from serving_core.settings import Settings


class LocalRunner(QueuedRunner):
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        observer: Observer | None,
        open_connections: Callable[[], int | None],
        runtime: Runtime,
    ) -> None:
        self.policy = policy_for(settings, engine, open_connections=open_connections)
        self.batcher = Batcher(
            engine.run,
            policy=self.policy,
            max_batch_size=engine.max_batch_size,
            max_queue=settings.max_queue,
            observer=observer,
        )
        # What this worker's requests wait on, and how they wake the model thread.
        self.batcher.new_future = runtime.new_future
        self.batcher.defer_wake = runtime.defer_wake
        super().__init__(self.batcher)
        self.model_thread = self.batcher

    def start(self, warm_up: Callable[[], object] | None) -> None:
        super().start(warm_up)
        if warm_up is None:
            return
        # Runs in the worker after fork: the first real request does not pay for
        # lazy initialisation, and a handler that breaks the contract stops the
        # worker at boot instead of failing requests.
        try:
            warm_up()
        except BaseException:
            # The model thread may still be in the sample: exit without waiting.
            self.batcher.abandon("the warm-up failed")
            raise
        self.policy.cost.reset()  # the sample's batch says nothing of real traffic
