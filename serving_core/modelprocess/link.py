"""One worker's connection to one model process, and its requests in flight on it."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from serving_core.engine.pending import Pending
from serving_core.errors import NotReady
from serving_core.modelprocess.protocol import Answer, Request, recv_frame, send_frame
from serving_core.runtime import Runtime

log = logging.getLogger("serving_core.modelprocess.link")

RECONNECT_PAUSE_S = 0.05  # while the model process (re)starts


class Link:
    """Sends requests as they come; ``run`` reads the answers, in any order, and
    connects again whenever the model process goes."""

    def __init__(self, path: str, stopping: Callable[[], bool], runtime: Runtime) -> None:
        self.path = path
        self.stopping = stopping
        self.sock: socket.socket | None = None
        self.pending: dict[int, Pending] = {}
        self.connected = threading.Event()
        # A sendall may wait for room in the socket (the model process slow to read);
        # under gevent it yields to the hub meanwhile, so the lock must be gevent's:
        # a native one would block the hub for the next greenlet that sends.
        self._send_lock = runtime.new_lock()

    def send(self, request: Request, pending: Pending) -> None:
        sock = self.sock
        self.pending[request.seq] = pending
        try:
            if sock is None:
                raise OSError("not connected")
            with self._send_lock:
                send_frame(sock, request)
        except OSError:
            self.pending.pop(request.seq, None)
            raise NotReady("the shared model process went away; retry shortly") from None

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def run(self) -> None:
        """Connect, read answers until the model process goes, fail what it held, again."""
        while not self.stopping():
            sock = self._connect()
            if sock is None:
                time.sleep(RECONNECT_PAUSE_S)
                continue
            self.sock = sock
            self.connected.set()
            try:
                self._read(sock)
            finally:
                self.connected.clear()
                if self.sock is sock:
                    self.sock = None
                with contextlib.suppress(OSError):
                    sock.close()
                self._fail_all()

    def _connect(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            return None
        return sock

    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                answer: Answer = recv_frame(sock)
            except (EOFError, OSError):
                return
            except Exception:
                # Which request it answered is unknown: fail every one in flight
                # (503, retried) rather than leave them waiting, and reconnect.
                log.exception("an answer from the model process at %s was unreadable", self.path)
                return
            pending = self.pending.pop(answer.seq, None)
            if pending is None or pending.future.done():
                continue  # its request gave up at its deadline
            pending.batch_size = answer.batch_size
            # One clock for every process of a machine: the worker draws the queue
            # span from its own enqueue to the model process's batch start.
            pending.started = answer.started
            pending.batch_span = answer.batch_span
            with contextlib.suppress(Exception):  # cancelled meanwhile: nobody waits
                if answer.error is None:
                    pending.future.set_result(answer.output)
                else:
                    pending.future.set_exception(answer.error)

    def _fail_all(self) -> None:
        pending, self.pending = self.pending, {}
        if pending and not self.stopping():
            log.warning(
                "the shared model process at %s went away with %d requests in flight",
                self.path,
                len(pending),
            )
        for one in pending.values():
            if not one.future.done():
                with contextlib.suppress(Exception):
                    one.future.set_exception(
                        NotReady(
                            "the shared model process stopped while this request was in it; "
                            f"retry (request id {one.request_id})"
                        )
                    )
