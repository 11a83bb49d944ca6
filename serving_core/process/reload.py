"""``serving-core serve --reload``: a new version of the handler takes over when its
files change, and not one request fails on the way.

    reloader  bind SERVING_BIND (and keep it, for its whole life)
              → start a server: ``serving-core serve`` as a child, handed the
                listening socket and a pipe (``Handoff``)
              → watch the handler's files (``handlerfiles``)
              → a change: start another server over the same socket; once each
                of its workers has passed its warm-up (a byte on the pipe),
                SIGTERM the old one, which finishes what it holds and stops
              → a new server that fails (a syntax error, ``setup()`` raising,
                the sample failing) exits; the old one serves on.

Each version is a whole ``serving-core serve``, in a fresh interpreter: its
handler's modules are imported anew, and its start is a start's every check
(load, ``setup()`` in its master, then ``setup_worker()`` and the sample in
each worker). Nothing of the old version's code is left in the new one, as it
would be after a module reload in the same process.

Why no request fails: the socket is the reloader's, and every server listens
on that same socket (gunicorn's ``fd://`` bind). The kernel queues a new
connection on it whoever accepts it, so while the old workers stop accepting
and the new ones are not yet accepting, connections wait in the backlog
rather than being refused. The old server's SIGTERM is production's (``drain``):
its answers close their keep-alive connections and it finishes its
requests before it exits.

gunicorn's own answers do not do this: its ``reload`` option restarts each
worker in place, and with ``preload_app`` (which ``serve`` needs: the model is
loaded once, in the master) a worker forked again runs the master's old code;
SIGHUP reloads the configuration, not preloaded code; USR2 re-executes a new
master that outlives the old one, so a terminal's Ctrl-C no longer reaches it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import selectors
import signal
import subprocess
from collections.abc import Callable
from types import FrameType

from gunicorn import sock
from gunicorn.arbiter import Arbiter
from gunicorn.config import Config

from serving_core.process.handlerfiles import HandlerFiles, Snapshot, changed
from serving_core.process.handoff import READY, Handoff
from serving_core.process.prefork import die_with
from serving_core.settings import Settings, SettingsError

log = logging.getLogger("serving_core.process.reload")

POLL_S = 0.25  # how often the handler's files are looked at


def refuse_unsupported(settings: Settings) -> None:
    """Refuse the settings ``--reload`` cannot serve; raises ``SettingsError``."""
    if settings.grpc_port:
        raise SettingsError(
            f"--reload does not serve gRPC (SERVING_GRPC_PORT={settings.grpc_port}): during "
            "a reload two servers run, and the port is held by one; unset SERVING_GRPC_PORT, "
            "or serve without --reload"
        )
    if settings.metrics_dir:
        raise SettingsError(
            f"--reload keeps each version's metrics in a directory of its own, and "
            f"SERVING_METRICS_DIR={settings.metrics_dir} would be shared by two servers, each "
            "deleting the other's files; unset SERVING_METRICS_DIR, or serve without --reload"
        )


class Edition:
    """One server the reloader started, for one state of the handler's files."""

    def __init__(self, process: subprocess.Popen[bytes], ready_fd: int, workers: int) -> None:
        self.process = process
        self.ready_fd = ready_fd  # the pipe's read end
        self.workers = workers
        self.announced = 0
        self.served = False  # it was the serving one, before it was retired

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def ready(self) -> bool:
        return self.announced >= self.workers

    def read(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self.announced += os.read(self.ready_fd, 4096).count(READY)

    def exited(self) -> int | None:
        return self.process.poll()

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.ready_fd)


class Reloader:
    """Serves the handler through ``serving-core serve`` children, one version at a time
    (two, for the moment of a swap), on the socket it holds.

    ``command``: the command line of one server, given its ``Handoff``.
    """

    def __init__(
        self,
        settings: Settings,
        command: Callable[[Handoff], list[str]],
        files: HandlerFiles,
        *,
        poll_s: float = POLL_S,
    ) -> None:
        self.settings = settings
        self.command = command
        self.files = files
        self.poll_s = poll_s
        self.selector = selectors.DefaultSelector()
        self.serving: Edition | None = None
        self.starting: Edition | None = None
        self.leaving: list[Edition] = []
        self.stop_signal: int | None = None
        self.listen_fd = -1

    def run(self) -> int:
        cfg = Config()
        cfg.set("bind", [self.settings.bind])
        # gunicorn's own sockets, so the backlog and options are a plain serve's;
        # a taken port stops here as it would stop serve.
        listeners = sock.create_sockets(cfg, log)
        self.listen_fd = listeners[0].fileno()
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        os.set_blocking(wake_read, False)
        self.selector.register(wake_read, selectors.EVENT_READ)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        previous_wake = signal.set_wakeup_fd(wake_write)
        try:
            log.info(
                "--reload: serving %s on %s; watching %s for changes",
                self.settings.handler,
                self.settings.bind,
                self.files.describe(),
            )
            self._watch(wake_read)
            self._stop()
        finally:
            signal.set_wakeup_fd(previous_wake)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.selector.close()
            os.close(wake_read)
            os.close(wake_write)
            sock.close_sockets(listeners)
        return 0

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.stop_signal = sig

    def _watch(self, wake_read: int) -> None:
        seen = self.files.snapshot()
        settling: Snapshot | None = None
        self._start([])
        while self.stop_signal is None:
            for key, _ in self.selector.select(self.poll_s):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake_read, 4096)
                else:
                    key.data.read()
            self._follow()
            now = self.files.snapshot()
            if now == seen:
                settling = None
            elif now != settling:
                settling = now  # an editor may still be writing: look once more
            else:
                self._start(changed(seen, now))
                seen, settling = now, None

    def _start(self, paths: list[str]) -> None:
        if self.starting is not None:
            # Overtaken by a newer edit before it was ready: it stops as any server
            # does, finishing what its first workers may have accepted.
            self._retire(self.starting)
            self.starting = None
        if paths:
            log.info("--reload: %s changed; starting the new version", ", ".join(paths))
        ready_read, ready_write = os.pipe()
        os.set_blocking(ready_read, False)
        handoff = Handoff(self.listen_fd, ready_write)
        try:
            process = subprocess.Popen(
                self.command(handoff),
                pass_fds=(self.listen_fd, ready_write),
                # A reloader killed outright takes its servers with it (SIGTERM). It
                # runs no thread, so the fork's child may run Python before its exec.
                preexec_fn=functools.partial(die_with, os.getpid()),  # noqa: PLW1509
            )
        finally:
            os.close(ready_write)  # the server's workers hold it now
        edition = Edition(process, ready_read, self.settings.workers)
        self.selector.register(ready_read, selectors.EVENT_READ, edition)
        self.starting = edition

    def _follow(self) -> None:
        """What the servers did since the last look: a new one ready or failed, the
        serving one gone, an old one stopped."""
        starting = self.starting
        if starting is not None and starting.ready:
            self.starting = None
            if self.serving is not None:
                log.info(
                    "--reload: the new version (pid %d) is serving; the previous one "
                    "(pid %d) finishes its requests and stops",
                    starting.pid,
                    self.serving.pid,
                )
                self._retire(self.serving)
            else:
                log.info("--reload: serving (pid %d)", starting.pid)
            self.serving = starting
            starting.served = True
        elif starting is not None and (status := starting.exited()) is not None:
            self.starting = None
            self._forget(starting)
            log.error(
                "--reload: %s did not start: %s (its error is above); %s; save a fix to try again",
                self.settings.handler,
                why(status),
                "the previous version serves on" if self.serving else "nothing is served",
            )
        serving = self.serving
        if serving is not None and (status := serving.exited()) is not None:
            self.serving = None
            self._forget(serving)
            log.error(
                "--reload: the server (pid %d) exited (%s); nothing is served until a change "
                "to the handler's files starts it again",
                serving.pid,
                why(status),
            )
        for edition in list(self.leaving):
            if edition.exited() is not None:
                self.leaving.remove(edition)
                self._forget(edition)
                what = "the previous version" if edition.served else "a start overtaken by an edit"
                log.info("--reload: %s (pid %d) has stopped", what, edition.pid)

    def _retire(self, edition: Edition) -> None:
        edition.signal(signal.SIGTERM)
        self.leaving.append(edition)

    def _forget(self, edition: Edition) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(edition.ready_fd)
        edition.close()

    def _stop(self) -> None:
        """Pass the signal on (SIGINT: quick, SIGTERM: a drain) and wait for every server."""
        sig = self.stop_signal or signal.SIGTERM
        editions = [e for e in (self.serving, self.starting, *self.leaving) if e is not None]
        for edition in editions:
            edition.signal(sig)
        for edition in editions:
            edition.process.wait()
            self._forget(edition)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def why(status: int) -> str:
    """A server's exit status, as the reason it gave up."""
    if status == Arbiter.WORKER_BOOT_ERROR:
        return "a worker's start failed (setup_worker() or the sample in sample.json)"
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"
