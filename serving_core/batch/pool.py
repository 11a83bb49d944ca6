"""The batch run's forked workers, and what each of them runs.

``Pool`` forks W workers from the preloaded parent (fork, not spawn: they share
the model ``setup()`` loaded). Each worker takes its share of the cores, runs
``setup_worker()``, builds its own ``Engine`` and then predicts the chunks it
is handed. A worker dies with the parent (``PR_SET_PDEATHSIG``), and one that
dies breaks the pool at once (``BrokenProcessPool``).

Traced, the pool forks its workers at once, before the parent's tracer (and its
exporter's thread) starts; each worker starts its own, and sends what it holds
when the pool closes. Its model spans are children of the chunk's span, which
the parent hands over with the chunk.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from serving_core import encoding
from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.errors import ServingError
from serving_core.handler import Handler, Output, Params
from serving_core.threads import held, set_worker_threads
from serving_core.tracing import setup as tracing
from serving_core.tracing.tracer import Tracer

log = logging.getLogger("serving_core.batch.pool")

PR_SET_PDEATHSIG = 1
CLOSE_WAIT_S = 10.0  # for the workers of a finished run to exit, their spans sent

OnResult = Callable[[Params, Output], None]
# Starts a process's tracer (``tracing.setup.start_for`` over the run's settings).
StartTracing = Callable[[], Tracer]
# Per record, in order: (True, output JSON) or (False, error JSON).
Answers = list[tuple[bool, bytes]]


class Pool:
    """W forked workers, each with the handler over its own ``Engine``."""

    def __init__(
        self,
        handler: Handler,
        workers: int,
        max_batch_size: int,
        on_result: OnResult | None,
        start_tracing: StartTracing | None = None,
    ) -> None:
        # The processes this pool forks are the children that appear after this:
        # the parent starts no other (the handler's code runs in the workers).
        self._others = set(multiprocessing.active_children())
        self._executor = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_start_worker,
            initargs=(
                _Setup(handler, max_batch_size, workers, on_result, os.getpid(), start_tracing),
            ),
        )
        if start_tracing is not None:
            # A first task forks every worker now (a fork pool forks them all at its
            # first submit), so that the parent's tracer starts after.
            self._executor.submit(int)

    def submit(
        self, params: list[Params], keys: list[str], traceparent: str | None = None
    ) -> Future[Answers]:
        """``traceparent``: the chunk's span, the parent of its model spans."""
        return self._executor.submit(_predict, params, keys, traceparent)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Every chunk is written: the idle workers exit on their own (sending their
        last spans), and those still there after ``wait_s`` are killed (a handler's
        thread may hold one)."""
        self._executor.shutdown(wait=False)
        deadline = time.monotonic() + wait_s
        for process in set(multiprocessing.active_children()) - self._others:
            process.join(max(0.0, deadline - time.monotonic()))
        self.stop()

    def stop(self) -> None:
        """Cancel what waits and kill the workers: the chunks they hold are dropped."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        # Workers ignore SIGINT and would finish their chunk otherwise, whose
        # results would be dropped anyway.
        for process in set(multiprocessing.active_children()) - self._others:
            process.kill()
        self._executor.shutdown(wait=True)


# -- in each worker process ---------------------------------------------------


@dataclass
class _Worker:
    engine: Engine | None = None
    on_result: OnResult | None = None


# ProcessPoolExecutor runs module-level functions in the workers; this is the
# one piece of per-process state they share, filled once by the initializer.
_worker = _Worker()


@dataclass(frozen=True)
class _Setup:
    """What a worker is started with (handed over by fork, never pickled)."""

    handler: Handler
    max_batch_size: int
    workers: int
    on_result: OnResult | None
    parent: int
    start_tracing: StartTracing | None


def _start_worker(setup: _Setup) -> None:
    # Ctrl-C reaches the whole process group: the parent alone decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with(setup.parent)
    set_worker_threads(setup.workers)
    if setup.start_tracing is not None:
        setup.start_tracing()  # the worker's own exporter (and thread), made after fork
        # Run by multiprocessing as the worker exits (``Pool.close``): atexit is not.
        multiprocessing.util.Finalize(None, tracing.stop, exitpriority=10)
    setup.handler.setup_worker()
    _worker.engine = Engine(setup.handler, max_batch_size=setup.max_batch_size)
    _worker.on_result = setup.on_result


def _die_with(parent: int) -> None:
    """SIGKILL this worker when the parent dies (a killed parent cannot stop it)."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _predict(params: list[Params], keys: list[str], traceparent: str | None) -> Answers:
    """One chunk, encoded here, so that the parent, the one writer, only copies bytes."""
    engine, on_result = _worker.engine, _worker.on_result
    assert engine is not None, "the worker initializer did not run"
    contexts = [Context(key, traceparent=traceparent) for key in keys]
    with held():  # busy for the whole chunk: its cores are lent only once the run ends
        results = engine.predict_many(params, contexts)
    answers: Answers = []
    for one, result in zip(params, results, strict=True):
        if isinstance(result, ServingError):
            answers.append((False, encoding.dumps(result.body()["error"])))
            continue
        try:
            answers.append((True, encoding.dumps(result)))
        except TypeError as exc:
            message = f"the handler's output cannot be written as JSON: {exc}"
            answers.append((False, encoding.dumps({"type": "model_error", "message": message})))
            continue
        if on_result is not None:
            try:
                on_result(one, result)
            except Exception:
                # A result not cached is a later miss, never a failed record.
                log.warning("--warm-cache: writing a result failed", exc_info=True)
    return answers
