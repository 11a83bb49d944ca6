"""gunicorn with the handler preloaded in the master and one batcher per worker.

Order of events (``serving-core serve``):

1. master: read ``Settings``, import the handler, ``preload`` it (torch at
   one thread, ``handler.setup()`` loads the model and tokenizer once,
   ``gc.freeze()``: ``serving_core.preload``), build the app, then fork.
2. ``post_fork`` in each worker (gunicorn's hooks are ``hooks.Hooks``): torch
   intra-op threads = usable cores // workers, ``setup_worker()``, start the
   model thread, run the sample, start the watchdog (``watchdog``,
   ``recycle``: a hung model, a leak).
3. SIGTERM: ``/readyz`` turns 503 while every worker serves on for
   ``SERVING_DRAIN_S``, then stops accepting and finishes its requests
   (``drain``); ``worker_exit``: finish the queued items, stop the model thread.
4. ``child_exit`` (master): fold the dead worker's metric files into one.

A worker also leaves after ``max_requests`` (plus jitter); gunicorn forks
its replacement from the master, so the model is never loaded again.

Fork safety: one multi-threaded torch operation before fork leaves GNU
OpenMP's thread pool unusable in the forked children, and a worker then hangs
on its first parallel operation on its main thread (``setup_worker``; each
respawned worker again). The pool belongs to the thread that made it, so the
worker's model thread, a new thread, is spared. The preload keeps torch at one
thread in the master, so no pool exists before fork, which keeps a handler that
computes in ``setup()`` safe (the MiniLM handler traces its model there).
"""

from __future__ import annotations

import logging
import sys
import tempfile
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from serving_core.device import model_devices
from serving_core.engine.engine import Engine
from serving_core.handler import model_revision
from serving_core.loading import LoadedHandler
from serving_core.metrics.metrics import Metrics
from serving_core.modelprocess.protocol import socket_path
from serving_core.modelprocess.supervisor import ModelProcess
from serving_core.online.service import Service
from serving_core.payloads.logger import PayloadLog
from serving_core.preload import preload
from serving_core.process import grpcport, wire
from serving_core.process.drain import DrainingArbiter
from serving_core.process.handoff import Handoff
from serving_core.process.hooks import Hooks
from serving_core.process.options import gunicorn_options
from serving_core.runtime import THREADS, Runtime
from serving_core.settings import Settings
from serving_core.threads import share_idle_cores
from serving_core.web import guard
from serving_core.web.app import create_app

log = logging.getLogger("serving_core.process.server")


class ServingApplication(BaseApplication):  # type: ignore[misc]
    def __init__(
        self,
        app: Flask,
        options: dict[str, Any],
        *,
        drain_s: float = 0.0,
        handed_over: bool = False,
    ) -> None:
        self.application = app
        self.options = options
        self.drain_s = drain_s
        self.handed_over = handed_over
        super().__init__()

    def run(self) -> None:
        # BaseApplication.run, with the master that drains on SIGTERM.
        try:
            DrainingArbiter(self, self.drain_s, handed_over=self.handed_over).run()
        except RuntimeError as exc:
            print(f"\nError: {exc}\n", file=sys.stderr)
            sys.stderr.flush()
            sys.exit(1)

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        return self.application


def warn_about(settings: Settings, service: Service) -> None:
    if settings.worker_class != "gthread":
        return
    if service.batched and settings.threads < settings.max_batch_size:
        log.warning(
            "SERVING_THREADS=%d is below SERVING_MAX_BATCH_SIZE=%d: a worker can never "
            "hold a full batch; raise SERVING_THREADS",
            settings.threads,
            settings.max_batch_size,
        )
    elif settings.threads <= settings.max_queue + service.max_batch_size:
        log.warning(
            "SERVING_THREADS=%d leaves no thread free beyond a full queue "
            "(SERVING_MAX_QUEUE=%d) and a running batch: under overload, refusals "
            "wait for a thread; raise SERVING_THREADS or lower SERVING_MAX_QUEUE",
            settings.threads,
            settings.max_queue,
        )


LOOPBACK = ("127.0.0.1", "localhost", "[::1]", "::1")


def say_where(bind: str) -> None:
    """A server on the loopback serves no one outside its machine (or container): say
    so, since that is the image's default and a first ``docker run -p`` meets it."""
    host, _, port = bind.rpartition(":")
    if host in LOOPBACK or host.startswith("127."):
        log.info(
            "bound to %s only: set SERVING_BIND=0.0.0.0:%s to expose it (and put nginx in "
            "front: alone, no proxy's limits protect it)",
            host,
            port,
        )


def runtime_for(settings: Settings) -> Runtime:
    """How the configured worker's requests wait: greenlets (gevent) or threads."""
    if settings.worker_class == "gevent":
        # Imported only for gevent: a gthread server never imports gevent.
        from serving_core.process.workers import green as greenworker

        return greenworker.RUNTIME
    return THREADS


def build(settings: Settings, loaded: LoadedHandler) -> tuple[Flask, Service, list[ModelProcess]]:
    """The objects of one server, built here and passed down: metrics, the engine
    over the handler, the online service around it, the app over that, and the
    shared model processes when there are any (forked later, by the master)."""
    app, service, models, _ = build_with_metrics(settings, loaded)
    return app, service, models


def build_with_metrics(
    settings: Settings, loaded: LoadedHandler
) -> tuple[Flask, Service, list[ModelProcess], Metrics]:
    """``build``, and its metrics, which the gRPC front counts its calls in too."""
    observer = Metrics()
    observer.model_info(loaded.handler, settings.model_revision)
    engine = Engine(
        loaded.handler,
        max_batch_size=settings.max_batch_size,
        max_tokens=settings.max_tokens,
        on_failure=observer.failed,
    )
    models = []
    if engine.stepper is not None and settings.shared_model and settings.workers > 1:
        # A generating handler's decoder runs in each worker (``online/runner/choice.py``):
        # its events do not cross the model process's socket.
        log.warning(
            "%s generates: each of the %d workers runs its own decoder and holds its own "
            "copy of the model on %s; set SERVING_WORKERS=1 to keep one copy",
            engine.name,
            settings.workers,
            settings.device,
        )
    if settings.shared_model and not loaded.handler.concurrent and engine.stepper is None:
        folder = tempfile.mkdtemp(prefix="serving-core-model-")
        devices = model_devices(settings.device, settings.model_processes)
        models = [
            ModelProcess(
                settings,
                engine,
                path=socket_path(folder, index),
                sample=loaded.sample,
                observer=observer,
                device=device,
                processes=len(devices),
            )
            for index, device in enumerate(devices)
        ]
    service = Service(
        settings,
        loaded,
        engine,
        observer=observer,
        cache_observer=observer,
        generation_observer=observer.generation,
        model_sockets=[model.path for model in models],
        runtime=runtime_for(settings),
        payloads=PayloadLog.from_settings(settings, loaded.handler, observer),
    )
    return create_app(settings, service, observer), service, models, observer


def serve(settings: Settings, loaded: LoadedHandler, handoff: Handoff | None = None) -> None:
    """Set up the handler in this (master) process, then hand over to gunicorn.

    ``handoff``: started by ``serve --reload`` (``reload``), which holds the socket
    and waits for each first worker to say that its warm-up passed."""
    preload(loaded.handler)
    app, service, models, metrics = build_with_metrics(settings, loaded)
    # Per-worker: the workers lend each other their cores while idle. Shared: the
    # model process (on a GPU, or the one core the workers leave) lends to none.
    share_idle_cores(settings, 1 if models else settings.workers)
    warn_about(settings, service)
    say_where(settings.bind)
    wire.install()  # gunicorn's response and error paths, in this process and its workers
    if settings.worker_class == "gevent":
        from serving_core.process.workers import fairaccept

        fairaccept.share_connections(settings.workers)
    # Held while the master runs: a second server on the same gRPC port fails here.
    held = grpcport.hold(settings)
    hooks = Hooks(settings, service, models, metrics, app.extensions[guard.EXTENSION])
    options = gunicorn_options(
        settings, hooks, service.name, model_revision(loaded.handler, settings.model_revision)
    )
    if handoff is not None:
        options["bind"] = handoff.bind
        hooks.on_ready = handoff.announce_ready
    ServingApplication(
        app, options, drain_s=settings.drain_s, handed_over=handoff is not None
    ).run()
    if held is not None:
        held.close()
