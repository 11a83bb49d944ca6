"""The shared model process of each GPU (``SERVING_MODEL_PROCESS=shared``).

The model process batches, warms up and applies admission; this worker still
validates, preprocesses and postprocesses. It has no model thread, so its
watchdog watches only its memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from serving_core.engine.observer import Observer
from serving_core.modelprocess.client import RemoteBatcher
from serving_core.online.runner.queued import QueuedRunner
from serving_core.runtime import Runtime


class SharedRunner(QueuedRunner):
    def __init__(
        self,
        sockets: Sequence[str],
        *,
        max_queue: int,
        observer: Observer | None,
        open_connections: Callable[[], int | None],
        runtime: Runtime,
    ) -> None:
        super().__init__(
            RemoteBatcher(
                sockets,
                max_queue=max_queue,
                observer=observer,
                open_connections=open_connections,
                runtime=runtime,
            )
        )
