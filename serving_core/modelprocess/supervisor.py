"""The master's handle on a shared model process: forks it, and again whenever it dies."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from serving_core.engine.engine import Engine
from serving_core.engine.observer import Observer
from serving_core.modelprocess.main import STOP_SIGNAL, run_model_process
from serving_core.settings import Settings

log = logging.getLogger("serving_core.modelprocess.supervisor")

RESPAWN_PAUSE_S = 1.0  # between forks of a model process that keeps dying
# gunicorn's master handles these by writing to its own pipe: a child must not.
MASTER_SIGNALS = (
    signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGWINCH, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)  # fmt: skip


class ModelProcess:
    """One model process of a server, forked from a watcher thread of the master."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        path: str,
        sample: dict[str, Any] | None,
        observer: Observer | None = None,
        device: str | None = None,
        processes: int = 1,
    ) -> None:
        """``path``: its socket (``protocol.socket_path``); ``device``: this model
        process's, for the handler's ``self.device`` (one GPU each when there are
        several); ``processes``: how many model processes share the cores the
        workers leave."""
        self.settings = settings
        self.engine = engine
        self.device = device
        self.processes = processes
        self.path = path
        self.sample = sample
        self.observer = observer
        self._close_in_child: Callable[[], None] = lambda: None
        self.pid = 0
        self._stopping = False
        self._watcher: threading.Thread | None = None

    def start(self, close_in_child: Callable[[], None] = lambda: None) -> None:
        """Fork the model process, and watch it from a thread of this process.

        ``close_in_child``: what the child must not hold (gunicorn's listening
        sockets: a model process keeping them open would keep the port bound)."""
        self._close_in_child = close_in_child
        self._watcher = threading.Thread(
            target=self._watch, name="serving-model-watch", daemon=True
        )
        self._watcher.start()

    def stop(self) -> None:
        """Let the model process finish what it holds and exit; fork no other."""
        self._stopping = True
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, STOP_SIGNAL)

    def _watch(self) -> None:
        while not self._stopping:
            pid = os.fork()
            if pid == 0:
                self._child()  # never returns
            self.pid = pid
            _wait_for_exit(pid)
            if self._stopping:
                return
            log.warning("the shared model process %d exited; starting another", pid)
            time.sleep(RESPAWN_PAUSE_S)

    def _child(self) -> None:
        code = 1
        try:
            for sig in MASTER_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master decides
            self._close_in_child()
            if self.device is not None:
                self.engine.handler.device = self.device
            run_model_process(
                self.settings,
                self.engine,
                path=self.path,
                sample=self.sample,
                observer=self.observer,
                processes=self.processes,
            )
            code = 0
        except BaseException:
            log.exception("the shared model process failed")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _wait_for_exit(pid: int) -> None:
    """Until ``pid`` has exited. gunicorn's master reaps every child with waitpid(-1),
    so waitpid is not ours to call: a pidfd becomes readable when the process ends,
    whoever reaps it."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):  # not Linux 5.3+: poll for it
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
    try:
        select.select([pidfd], [], [])
    finally:
        os.close(pidfd)
