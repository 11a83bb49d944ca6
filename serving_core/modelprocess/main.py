"""In the model process: the batcher over the engine, fed by every worker's connection."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import queue
import signal
import socket
import threading
import time
from concurrent.futures import Future
from typing import Any, TypeAlias

from serving_core.context import Context
from serving_core.cores import usable_cores
from serving_core.engine.batcher import Batcher
from serving_core.engine.engine import Engine
from serving_core.engine.observer import Observer
from serving_core.engine.pending import Pending
from serving_core.engine.policy import policy_for
from serving_core.errors import ModelError, ServingError
from serving_core.modelprocess.protocol import Answer, Request, recv_frame, send_frame
from serving_core.settings import Settings
from serving_core.threads import set_model_threads
from serving_core.tracing import setup as tracing

log = logging.getLogger("serving_core.modelprocess.main")

WARM_UP_TIMEOUT_S = 600.0
# The master's word to stop: SIGTERM is ignored in the model process, since a
# SIGTERM to the whole process group (docker stop, a terminal's Ctrl-C, a test)
# reaches it while the workers still drain through it; gunicorn's master stops
# it with this once every worker has gone (on_exit).
STOP_SIGNAL = signal.SIGUSR2
PARENT_CHECK_S = 1.0  # how often the model process looks for its master

# A connection's answers, in the order they resolve; None ends its writer.
Answers: TypeAlias = queue.SimpleQueue[tuple[int, Pending] | None]


class ModelServer:
    """The batcher over the engine; a reader and a writer thread per worker connection."""

    def __init__(self, engine: Engine, settings: Settings, observer: Observer | None) -> None:
        self.engine = engine
        self._open: dict[int, int] = {}  # connection id -> its worker's open connections
        policy = policy_for(settings, engine, open_connections=self.open_connections)
        # Every worker's requests share one queue: SERVING_MAX_QUEUE per worker, in all.
        self.batcher = Batcher(
            engine.run,
            policy=policy,
            max_batch_size=engine.max_batch_size,
            max_queue=settings.max_queue * settings.workers,
            observer=observer,
            name="serving-model-process",
        )

    def open_connections(self) -> int | None:
        if not self._open:
            return None
        return sum(self._open.values())

    def warm_up(self, sample: dict[str, Any] | None) -> None:
        """The sample through the batcher: lazy initialisation (CUDA kernels, the
        allocator) is paid before any worker can connect."""
        if sample is None:
            return
        ctx = Context("warm-up", time.monotonic() + WARM_UP_TIMEOUT_S)
        item = self.engine.prepare(dict(sample), ctx)
        output = self.batcher.submit(item, ctx, arrival=time.monotonic()).future.result()
        self.engine.finish(output, dict(sample), ctx)
        self.batcher.policy.cost.reset()

    def serve(self, listener: socket.socket) -> None:
        """Accept worker connections until the listener is closed."""
        for number in itertools.count():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._connection,
                args=(conn, number),
                name=f"model-conn-{number}",
                daemon=True,
            ).start()

    def _connection(self, conn: socket.socket, number: int) -> None:
        answers: Answers = queue.SimpleQueue()
        writer = threading.Thread(
            target=_write, args=(conn, answers), name=f"model-write-{number}", daemon=True
        )
        writer.start()
        try:
            while True:
                try:
                    request: Request = recv_frame(conn)
                except (EOFError, OSError):
                    return
                except Exception:
                    # Not a request this model process can read: that worker sees the
                    # connection close, fails its requests in flight, and reconnects.
                    log.exception("a worker's request could not be read; closing its connection")
                    return
                if request.open_connections is not None:
                    self._open[number] = request.open_connections
                self._submit(request, answers)
        finally:
            self._open.pop(number, None)
            answers.put(None)
            writer.join()
            conn.close()

    def _submit(self, request: Request, answers: Answers) -> None:
        ctx = Context(request.request_id, request.deadline, request.traceparent)
        try:
            pending = self.batcher.submit(request.item, ctx, arrival=request.arrival)
        except ServingError as exc:  # refused at admission: answered at once
            refused = Pending(request.item, ctx, request.arrival)
            refused.future.set_exception(exc)
            answers.put((request.seq, refused))
            return
        pending.future.add_done_callback(functools.partial(_answer, answers, request.seq, pending))


def _answer(answers: Answers, seq: int, pending: Pending, future: Future[Any]) -> None:
    answers.put((seq, pending))


def _write(conn: socket.socket, answers: Answers) -> None:
    # Its own thread: pickling and sending never run on the model thread, which
    # resolves the futures and goes straight on to the next batch.
    while (answer := answers.get()) is not None:
        seq, pending = answer
        exc = pending.future.exception()
        if exc is None:
            message = Answer(
                seq,
                pending.future.result(),
                None,
                pending.batch_size,
                pending.started,
                pending.batch_span,
            )
        else:
            message = Answer(seq, None, _serving_error(exc), 0)
        try:
            send_frame(conn, message)
        except OSError:
            return  # the worker went away; its reader ends the connection
        except Exception as error:  # an output (or an error's details) pickle cannot carry
            log.exception("request %d: the answer could not be sent to its worker", seq)
            with contextlib.suppress(OSError):
                send_frame(conn, Answer(seq, None, _serving_error(error), 0))


def _serving_error(exc: BaseException) -> ServingError:
    if isinstance(exc, ServingError):
        return exc
    return ModelError(f"the shared model process failed: {type(exc).__name__}")


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
    threading.Thread(
        target=server.serve, args=(listener,), name="model-accept", daemon=True
    ).start()
    log.info("shared model process %d: serving %s on %s", os.getpid(), engine.name, path)
    # Until the master says so, or is gone (killed outright: no orphan left behind).
    while not stop.wait(PARENT_CHECK_S) and os.getppid() == master:
        pass
    # Finish what is queued (the workers drain theirs first), then go.
    listener.close()
    server.batcher.stop(settings.graceful_timeout_s)
    tracing.stop()  # the last batches' spans are sent before it goes
