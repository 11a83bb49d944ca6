"""How ``serve``, ``worker``, ``stream`` and ``check`` start: logging as the settings
say, the job queue's store and the cache's URL checked, then the handler and its
artifacts (SERVING_MODEL_URI, fetched before the model loads)."""

from __future__ import annotations

import os

from serving_core import logs
from serving_core.cache import stores
from serving_core.commands.failure import Failure
from serving_core.errors import HandlerError
from serving_core.jobs import backends
from serving_core.jobs.base import StoreRefused
from serving_core.loading import LoadedHandler, give_artifacts, load_handler
from serving_core.metrics.directory import enable_multiprocess
from serving_core.payloads import sinks
from serving_core.pipeline import transport
from serving_core.runtime import THREADS, Runtime
from serving_core.settings import Settings, SettingsError
from serving_core.tracing.tracer import log_fields


def load(
    settings: Settings,
    *,
    shared_metrics: bool,
    runtime: Runtime = THREADS,
    uses_queue: bool = False,
) -> LoadedHandler:
    """The handler ``settings`` name; a broken one, or a bad setting, is a ``Failure``.

    ``shared_metrics``: the processes' metrics are summed in SERVING_METRICS_DIR
    (serve and worker fork), chosen before the handler is imported, since it
    might import prometheus_client. ``runtime``: how a pipeline's stage calls wait
    (``serve`` passes its worker's). ``uses_queue``: the command opens the job
    queue, whose store is checked first (before a model loads for minutes).
    """
    try:
        logs.configure(settings.log_level, settings.log_format, log_fields)
        provide_grpc_stages()
        if shared_metrics:
            enable_multiprocess(settings.metrics_dir)
        check_cache(settings)
        check_payload_log(settings)
        if uses_queue:
            check_queue(settings)
        loaded = load_handler(
            settings.handler,
            device=settings.device,
            dtype=settings.dtype,
            environ=os.environ,
            runtime=runtime,
        )
        give_artifacts(
            loaded.handler,
            settings.model_uri,
            settings.model_cache,
            offline=settings.model_offline,
        )
        return loaded
    except (SettingsError, HandlerError, StoreRefused) as exc:
        raise Failure(str(exc)) from exc


def provide_grpc_stages() -> None:
    """Let a pipeline's ``grpc_env`` stages be called: the pipeline layer sits below
    ``grpc`` and is handed its client from here (``pipeline.transport``)."""
    transport.provide_grpc(_grpc_stages)


def _grpc_stages() -> transport.GrpcTransport:
    # Imported only when a pipeline has a gRPC stage: grpcio and the stubs stay out
    # of every other process.
    from serving_core.grpc.stage import GrpcStages

    return GrpcStages()


def check_cache(settings: Settings) -> None:
    """SERVING_CACHE_URL, checked by the store its scheme picks (``cache.stores``)."""
    try:
        stores.check(settings.cache_url)
    except ValueError as exc:
        raise Failure(str(exc)) from exc


def check_payload_log(settings: Settings) -> None:
    """SERVING_PAYLOAD_LOG_URL, checked by the sink its scheme picks (``payloads.sinks``)."""
    try:
        sinks.check(settings.payload_log_url)
    except ValueError as exc:
        raise Failure(str(exc)) from exc


def check_queue(settings: Settings) -> None:
    """Refuse a job queue URL its backend cannot use, or a store that would drop jobs it
    accepted (``StoreRefused``); every command that opens the queue (``serve``,
    ``worker``, and any later one) calls it. The backend is ``jobs.backends``' choice."""
    try:
        backends.check(settings)
    except ValueError as exc:
        raise Failure(str(exc)) from exc
