"""The batch run's forked workers, and what each of them runs.

``Pool`` forks W workers from the preloaded parent (fork, not spawn: they share
the model ``setup()`` loaded). Each worker takes its share of the cores, runs
``setup_worker()``, builds its own ``Engine`` and then predicts the chunks it
is handed. A worker dies with the parent (``PR_SET_PDEATHSIG``), and one that
dies breaks the pool at once (``BrokenProcessPool``).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from serving_core import encoding
from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.errors import ServingError
from serving_core.handler import Handler, Output, Params
from serving_core.threads import held, set_worker_threads

log = logging.getLogger("serving_core.batch.pool")

PR_SET_PDEATHSIG = 1

OnResult = Callable[[Params, Output], None]
# Per record, in order: (True, output JSON) or (False, error JSON).
Answers = list[tuple[bool, bytes]]


class Pool:
    """W forked workers, each with the handler over its own ``Engine``."""

    def __init__(
        self, handler: Handler, workers: int, max_batch_size: int, on_result: OnResult | None
    ) -> None:
        # The processes this pool forks are the children that appear after this:
        # the parent starts no other (the handler's code runs in the workers).
        self._others = set(multiprocessing.active_children())
        self._executor = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_start_worker,
            initargs=(handler, max_batch_size, workers, on_result, os.getpid()),
        )

    def submit(self, params: list[Params], keys: list[str]) -> Future[Answers]:
        return self._executor.submit(_predict, params, keys)

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


def _start_worker(
    handler: Handler,
    max_batch_size: int,
    workers: int,
    on_result: OnResult | None,
    parent: int,
) -> None:
    # Ctrl-C reaches the whole process group: the parent alone decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with(parent)
    set_worker_threads(workers)
    handler.setup_worker()
    _worker.engine = Engine(handler, max_batch_size=max_batch_size)
    _worker.on_result = on_result


def _die_with(parent: int) -> None:
    """SIGKILL this worker when the parent dies (a killed parent cannot stop it)."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _predict(params: list[Params], keys: list[str]) -> Answers:
    """One chunk, encoded here, so that the parent, the one writer, only copies bytes."""
    engine, on_result = _worker.engine, _worker.on_result
    assert engine is not None, "the worker initializer did not run"
    with held():  # busy for the whole chunk: its cores are lent only once the run ends
        results = engine.predict_many(params, [Context(key) for key in keys])
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
