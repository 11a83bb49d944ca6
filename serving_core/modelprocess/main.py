"""The model process's life: set up, warm up, listen, serve until the master says stop."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from typing import Any

from serving_core.cores import usable_cores
from serving_core.engine.engine import Engine
from serving_core.engine.observer import Observer
from serving_core.modelprocess.server import ModelServer
from serving_core.settings import Settings
from serving_core.threads import set_model_threads
from serving_core.tracing import setup as tracing

log = logging.getLogger("serving_core.modelprocess.main")

# The master's word to stop: SIGTERM is ignored in the model process, since a
# SIGTERM to the whole process group (docker stop, a terminal's Ctrl-C, a test)
# reaches it while the workers still drain through it; gunicorn's master stops
# it with this once every worker has gone (on_exit).
STOP_SIGNAL = signal.SIGUSR2
PARENT_CHECK_S = 1.0  # how often the model process looks for its master


def run_model_process(
    settings: Settings,
    engine: Engine,
    *,
    path: str,
    sample: dict[str, Any] | None,
    observer: Observer | None = None,
    processes: int = 1,
) -> None:
    """The model process's life: set up, warm up, listen, serve until the master stops it."""
    # The cores the workers leave, at least one, for torch's intra-op pool: a
    # torch thread that has to share its core with a worker's hub collapses
    # (OpenMP threads spin and wait on each other; a 15 ms call took 500 ms).
    set_model_threads(max(1, (usable_cores() - settings.workers) // processes))
    engine.handler.setup_worker()
    server = ModelServer(engine, settings, observer)
    server.batcher.start()
    server.warm_up(sample)
    # After warm-up, which is no request of anyone's; after fork, as in a worker.
    tracing.start_for(settings, engine.handler)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1024)
    stop = threading.Event()

    def on_stop(signum: int, frame: Any) -> None:
        stop.set()

    master = os.getppid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, on_stop)
    threading.Thread(target=server.serve, args=(listener,), name="model-io", daemon=True).start()
    log.info("shared model process %d: serving %s on %s", os.getpid(), engine.name, path)
    # Until the master says so, or is gone (killed outright: no orphan left behind).
    while not stop.wait(PARENT_CHECK_S) and os.getppid() == master:
        pass
    # Finish what is queued (the workers drain theirs first), then go.
    server.stop_listening()
    server.batcher.stop(settings.graceful_timeout_s)
    tracing.stop()  # the last batches' spans are sent before it goes
