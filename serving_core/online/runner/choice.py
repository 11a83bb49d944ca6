"""``runner_for``: the one place that chooses how a worker runs its model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from serving_core.engine.engine import Engine
from serving_core.engine.observer import GenerationObserver, Observer
from serving_core.online.runner.base import Runner
from serving_core.online.runner.concurrent import ConcurrentRunner
from serving_core.online.runner.decoding import DecodingRunner
from serving_core.online.runner.local import LocalRunner
from serving_core.online.runner.shared import SharedRunner
from serving_core.runtime import Runtime
from serving_core.settings import Settings


def runner_for(
    settings: Settings,
    engine: Engine,
    *,
    observer: Observer | None,
    generation_observer: GenerationObserver | None,
    model_sockets: Sequence[str],
    open_connections: Callable[[], int | None],
    runtime: Runtime,
) -> Runner:
    """A generating handler's decoder, a concurrent handler's calls in the request, the
    shared model processes when there are some, else the worker's own model thread."""
    if engine.stepper is not None:
        # In the worker, even with model processes: a stream's events do not
        # cross the model process's socket.
        return DecodingRunner(
            engine,
            max_queue=settings.max_queue,
            generation_timeout_s=settings.generation_timeout_s,
            margin_s=settings.hang_margin_s,
            observer=generation_observer,
            runtime=runtime,
        )
    if engine.handler.concurrent:
        return ConcurrentRunner(engine, max_queue=settings.max_queue, observer=observer)
    if model_sockets:
        return SharedRunner(
            list(model_sockets),
            max_queue=settings.max_queue,
            observer=observer,
            open_connections=open_connections,
            runtime=runtime,
        )
    return LocalRunner(
        settings,
        engine,
        observer=observer,
        open_connections=open_connections,
        runtime=runtime,
    )
