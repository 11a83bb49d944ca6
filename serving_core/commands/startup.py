"""How ``serve``, ``worker`` and ``check`` start: logging as the settings say, then the handler."""

from __future__ import annotations

import os

from serving_core import logs
from serving_core.commands.failure import Failure
from serving_core.errors import HandlerError
from serving_core.loading import LoadedHandler, load_handler
from serving_core.metrics.directory import enable_multiprocess
from serving_core.runtime import THREADS, Runtime
from serving_core.settings import Settings, SettingsError


def load(settings: Settings, *, shared_metrics: bool, runtime: Runtime = THREADS) -> LoadedHandler:
    """The handler ``settings`` name; a broken one, or a bad setting, is a ``Failure``.

    ``shared_metrics``: the processes' metrics are summed in SERVING_METRICS_DIR
    (serve and worker fork), chosen before the handler is imported, since it
    might import prometheus_client. ``runtime``: how a pipeline's stage calls wait
    (``serve`` passes its worker's).
    """
    try:
        logs.configure(settings.log_level, settings.log_format)
        if shared_metrics:
            enable_multiprocess(settings.metrics_dir)
        return load_handler(
            settings.handler,
            device=settings.device,
            dtype=settings.dtype,
            environ=os.environ,
            runtime=runtime,
        )
    except (SettingsError, HandlerError) as exc:
        raise Failure(str(exc)) from exc
