"""The master of ``serving-core worker`` and ``serving-core stream``: preload, fork the
consumers, fork again one that dies, stop them on SIGTERM; /healthz and /metrics.

    master    listen on SERVING_BIND (a port that is taken stops it here, before any fork)
              → preload: setup() once (torch at one thread), gc.collect(), gc.freeze()
              → fork SERVING_WORKERS consumers → serve /metrics and /healthz (``health``)
              → a consumer that dies is forked again from the loaded master

Nothing outlives the master: a master that fails kills its consumers, and a
consumer whose master dies (even by SIGKILL) is sent SIGTERM (Linux's
PR_SET_PDEATHSIG) and stops as on the master's own SIGTERM.

SIGTERM (or SIGINT) asks every consumer to stop: each finishes the batch in
hand and exits; SERVING_GRACEFUL_TIMEOUT_S later the rest are killed. What a
killed consumer held comes back from its queue or broker (at-least-once).

Our own small prefork master rather than gunicorn's arbiter: gunicorn's workers
accept HTTP connections, and these take jobs or messages. Imports no Flask.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import time
from types import FrameType

from serving_core.engine.engine import Engine
from serving_core.loading import LoadedHandler
from serving_core.metrics.metrics import Metrics
from serving_core.preload import preload
from serving_core.process import health
from serving_core.process.health import BindError
from serving_core.settings import Settings
from serving_core.threads import set_worker_threads, share_idle_cores
from serving_core.tracing import setup as tracing

log = logging.getLogger("serving_core.process.prefork")

RESPAWN_PAUSE_S = 1.0  # between forks of a consumer that keeps dying at start
PR_SET_PDEATHSIG = 1  # prctl(2)


class Prefork:
    """Forks the consumers from the loaded handler and keeps them running; a subclass
    says what a consumer does (``consume``) and what the master logs (``describe``)."""

    command = "serving-core worker"  # in messages

    def __init__(self, settings: Settings, loaded: LoadedHandler) -> None:
        self.settings = settings
        self.loaded = loaded
        self.children: dict[int, int] = {}  # pid -> slot
        self.stopping = False
        self.master_pid = os.getpid()
        self.server: health.HealthServer

    def consume(self, slot: int, stopping: dict[str, bool]) -> int:
        """One consumer's life, in the forked process; returns its exit status.
        ``stopping["asked"]`` turns true on SIGTERM."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.command}: {self.settings.workers} consumer(s)"

    def consumer_engine(self) -> tuple[Engine, Metrics]:
        """In a forked consumer: its share of the cores, its tracer (SERVING_TRACES), the
        handler's per-process setup, and the engine its batches run through (with the
        metrics it feeds)."""
        set_worker_threads(self.settings.workers)
        # After fork: the exporter's thread and connection are the consumer's own.
        tracing.start_for(self.settings, self.loaded.handler)
        self.loaded.handler.setup_worker()
        metrics = Metrics()
        metrics.model_info(self.loaded.handler, self.settings.model_revision)
        engine = Engine(
            self.loaded.handler,
            max_batch_size=self.settings.max_batch_size,
            max_tokens=self.settings.max_tokens,
            on_failure=metrics.failed,
        )
        return engine, metrics

    def consumer_name(self) -> str:
        """This consumer's name at its broker or queue: unique across hosts and forks."""
        return f"{socket.gethostname()}-{os.getpid()}"

    def run(self) -> int:
        if self.settings.bind.startswith("unix:"):
            raise BindError(
                f"SERVING_BIND={self.settings.bind}: {self.command} serves /healthz and "
                "/metrics over TCP; set SERVING_BIND=0.0.0.0:9090 (or 127.0.0.1:PORT)"
            )
        # Bound before any consumer is forked: a port that is taken stops the master
        # with no consumer left behind it.
        self.server = health.bind(self, self.settings.bind, self.command)
        try:
            return self._supervise()
        finally:
            self._kill(0, None)  # none outlives its master, whatever stopped it
            self.server.server_close()

    def _supervise(self) -> int:
        preload(self.loaded.handler)  # as serve and batch do
        share_idle_cores(self.settings, self.settings.workers)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for slot in range(self.settings.workers):
            self._fork(slot)
        # Served after the first forks, so they start without its thread (a respawned
        # consumer forks beside it, and never touches it).
        self.server.serve()
        # Under the command's own logger (jobmaster, streammaster).
        logging.getLogger(type(self).__module__).info("%s", self.describe())
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            slot = self.children.pop(pid, -1)
            if slot < 0:
                continue
            if not self.stopping:
                log.warning("consumer %d exited (status %d); starting another", pid, status)
                time.sleep(RESPAWN_PAUSE_S)
                self._fork(slot)
        self.server.shutdown()
        return 0

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            return
        self.stopping = True
        log.info("stopping: each consumer finishes the batch in hand")
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        # The graceful timeout bounds the drain: then the rest are killed (their
        # queue or broker hands what they held out again).
        signal.signal(signal.SIGALRM, self._kill)
        signal.setitimer(signal.ITIMER_REAL, max(0.001, self.settings.graceful_timeout_s))

    def _kill(self, signum: int, frame: FrameType | None) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _fork(self, slot: int) -> None:
        pid = os.fork()
        if pid:
            self.children[pid] = slot
            return
        code = 1
        try:
            stop = {"asked": False}

            def asked(signum: int, frame: FrameType | None) -> None:
                stop["asked"] = True

            signal.signal(signal.SIGTERM, asked)
            # The master decides; Ctrl-C reaches the whole process group.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            health.close_inherited(self.server)
            die_with(self.master_pid)
            code = self.consume(slot, stop)
        except BaseException:
            log.exception("consumer %d failed", os.getpid())
        finally:
            try:
                tracing.stop()  # its last batches' spans are sent before it goes
            finally:
                os._exit(code)


def die_with(master: int) -> None:
    """A consumer is sent SIGTERM (its graceful stop) when its master dies, even by
    SIGKILL: nothing may consume on without the master's supervision, /healthz and
    /metrics. Linux's PR_SET_PDEATHSIG; elsewhere, the master's own stop. (``serve
    --reload``'s servers too, each between its fork and its exec: the setting
    outlives the exec.)"""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != master:  # it died before prctl: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)
