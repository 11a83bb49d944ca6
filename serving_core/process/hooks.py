"""gunicorn's server hooks for ``serving-core serve``: the per-process work around fork.

A ``Hooks`` is made in the master, before fork, over the objects ``build``
made; its bound methods are gunicorn's hook settings (``options``):

- ``when_ready`` (master, once listening): fork the shared model processes;
- ``post_fork`` (each worker): its share of torch threads, then the service
  starts (model thread, sample, watchdog); a respawned worker whose warm-up
  fails leaves (``recycle``); a first worker says it is ready to ``serve
  --reload`` (``on_ready``); its gRPC front is made when SERVING_GRPC_PORT is
  set (before gevent patches ``queue``: grpcio's pool must wait on native
  queues);
- ``post_worker_init`` (each worker, patched by gevent): its tracer
  (SERVING_TRACES), then the gRPC front starts (its calls reach the service
  through the worker's ``Runtime.enter``: on a gevent worker, the hub, which
  runs from here on);
- ``worker_exit`` (each worker, leaving): finish the gRPC calls in hand, then
  the queued items, stop the model thread;
- ``child_exit`` (master): fold the dead worker's metric files into one;
- ``on_exit`` (master, last): stop the model processes, remove the metrics.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from serving_core.metrics.directory import remove_metrics_dir, worker_exited
from serving_core.metrics.metrics import Metrics
from serving_core.modelprocess.supervisor import ModelProcess
from serving_core.online.service import Service
from serving_core.process import recycle
from serving_core.settings import Settings
from serving_core.threads import most_threads, set_worker_threads
from serving_core.tracing import setup as tracing

if TYPE_CHECKING:
    from serving_core.grpc.front import GrpcFront
    from serving_core.web.guard import Guard

log = logging.getLogger("serving_core.process.hooks")


class Hooks:
    """One server's gunicorn hooks; ``server`` and ``worker`` are gunicorn's objects."""

    def __init__(
        self,
        settings: Settings,
        service: Service,
        models: Sequence[ModelProcess] = (),
        metrics: Metrics | None = None,
        guard: Guard | None = None,
    ) -> None:
        """``guard``: the HTTP app's keys check, made in the master; the gRPC front
        checks the same keys and shares their faults (/readyz)."""
        self.settings = settings
        self.guard = guard
        self.service = service
        self.models = models
        self.metrics = metrics  # the gRPC front counts its calls there
        # Made in the master, so every worker it forks counts in the same memory.
        self.failures = recycle.WarmUpFailures()
        self.grpc: GrpcFront | None = None  # each worker's own, made after fork
        # Told by each first worker whose warm-up passed (``serve --reload``'s handoff).
        self.on_ready: Callable[[], None] | None = None

    def when_ready(self, server: Any) -> None:
        if not self.models:
            return

        def close_listeners() -> None:
            for listener in server.LISTENERS:
                listener.close()

        # Forked from a thread of the master, which forks it again whenever it
        # dies; it must not hold gunicorn's listening sockets open.
        for model in self.models:
            model.start(close_in_child=close_listeners)

    def post_fork(self, server: Any, worker: Any) -> None:
        settings, service = self.settings, self.service
        # SIGTERM stays blocked until the worker's handlers are in (``drain``).
        worker.drain_s = settings.drain_s
        worker.on_drain = service.drain
        threads = set_worker_threads(settings.workers)
        worker.body_timeout_s = settings.body_timeout_s  # gevent (uploads); gthread ignores it
        try:
            # What only the worker knows: its connections, how its requests wait,
            # and how it leaves.
            service.start(
                open_connections=worker.open_connections,
                watch_client=getattr(worker, "watch_client", None),
                on_verdict=functools.partial(recycle.leave, worker),
            )
        except Exception as exc:
            if worker.age <= settings.workers:
                raise  # one of the first workers: gunicorn stops serve
            recycle.warm_up_failed(worker, self.failures, exc)
        self.failures.succeeded()
        if self.on_ready is not None and worker.age <= settings.workers:
            self.on_ready()
        if settings.grpc_port:
            self._make_grpc(worker)
        log.info("worker %s ready: %s", worker.pid, _torch_threads(threads))

    def post_worker_init(self, worker: Any) -> None:
        # The worker's own exporter (its thread and connection), once gevent has
        # patched the worker: the exporter imports ssl, which gevent must patch first.
        # Nothing is served before this; the warm-up in post_fork is not traced.
        tracing.start_for(self.settings, self.service.engine.handler)
        if self.grpc is not None:
            self.grpc.start()

    def _make_grpc(self, worker: Any) -> None:
        # Imported here, after fork: grpcio's threads must not exist in the master.
        from serving_core.grpc.front import GrpcFront
        from serving_core.web.guard import Guard, caller_of

        settings = self.settings
        # The HTTP app's own check, made in the master (finding H2): a keys file that
        # goes bad later shows on /readyz and lets fewer keys pass on both fronts; it
        # never stops a worker from starting.
        guard = self.guard if self.guard is not None else Guard(settings)
        keys = guard.keys
        allows = keys.allows if keys else None
        # The HTTP front's identity of a key too: a caller's cache entries and jobs are
        # its own on both fronts (SERVING_CACHE_PER_KEY).
        identify = caller_of if keys else None
        front = self.grpc = GrpcFront(
            settings,
            self.service,
            self.metrics,
            allows,
            identify,
            described=guard.serves_private_paths,
            open_description=bool(keys) and settings.public_metadata,
        )

        def drain() -> None:
            self.service.drain()
            front.drain()

        worker.on_drain = drain

    def worker_exit(self, server: Any, worker: Any) -> None:
        if self.grpc is not None:
            self.grpc.stop(self.settings.graceful_timeout_s)
        if not self.service.stop() and self.service.fault is None:
            log.warning("worker %s: the model thread did not finish in time", worker.pid)
        self.service.runtime.abandon()  # a gRPC call still waiting gives up
        tracing.stop()  # the spans of its last requests are sent before it goes

    def child_exit(self, server: Any, worker: Any) -> None:
        worker_exited(worker.pid)
        if self.settings.worker_class == "gevent":
            from serving_core.process.workers import fairaccept

            fairaccept.worker_exited(worker)

    def on_exit(self, server: Any) -> None:
        for model in self.models:
            model.stop()
        remove_metrics_dir()


def _torch_threads(share: int | None) -> str:
    """The start-up log's account of torch: the worker's share, and what it borrows
    (``threads.CoreLending``) for a batch while its siblings idle."""
    if share is None:
        return "no torch"
    most = most_threads()
    lent = f", up to {most} while its siblings idle" if most is not None and most > share else ""
    return f"{share} torch thread(s){lent}"
