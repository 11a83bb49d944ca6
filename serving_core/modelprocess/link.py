"""One worker's connection to one model process, and its requests in flight on it.

A request is queued, not sent at once: the requests queued since the last send
go as one frame (``protocol.frame``), when ``FRAME_REQUESTS`` of them are there
(sent by the request that fills it) or when the link's writer is woken. Under
gevent the writer is a greenlet, woken once the hub has run every request ready
in this turn of its loop; on threads, the requests queued while it sends go in
the next frame. So a burst of requests costs the model process one read, one
unpickle and one wake-up of its model thread. The reader takes each frame's
answers, in any order, and connects again whenever the model process goes.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

from serving_core.engine.pending import Pending
from serving_core.errors import NotReady
from serving_core.modelprocess.protocol import Answer, Frames, Request, frame
from serving_core.runtime import Runtime, Signal

log = logging.getLogger("serving_core.modelprocess.link")

RECONNECT_PAUSE_S = 0.05  # while the model process (re)starts
WRITER_IDLE_S = 1.0  # how often an idle writer looks whether the link is stopping
READ_BYTES = 1 << 18
# A frame goes once it holds this many requests, without waiting for the turn's end:
# a saturated worker's turn runs dozens of requests, and holding the first until the
# last is preprocessed cost more in latency (half the req/s, echo at c=64 on 2 cores)
# than the frames saved. 8 already spreads a frame's cost in the model process
# (a read, an unpickle, a wake-up) to an eighth: 45 µs an item there against 39
# for unbounded frames and 75 for a frame each.
FRAME_REQUESTS = 8


class Link:
    """Queues requests for its writer (``write``); ``run`` reads the answers, in any
    order, and connects again whenever the model process goes."""

    def __init__(self, path: str, stopping: Callable[[], bool], runtime: Runtime) -> None:
        self.path = path
        self.stopping = stopping
        self.sock: socket.socket | None = None
        self.pending: dict[int, Pending] = {}
        self.connected = threading.Event()
        self._outbox: list[Request] = []
        self._due = False  # the writer has been woken for what the outbox holds
        # Made by the writer, where it waits: under gevent, on the worker's hub once
        # it runs (the link is made in post_fork, before gevent has patched it).
        self._new_signal = runtime.new_signal
        self._wake: Signal | None = None
        # A native lock, held for an append or a swap only: a request thread's append
        # must not land in an outbox the writer has just taken.
        self._queue_lock = threading.Lock()
        self._send_lock = runtime.new_lock()

    def send(self, request: Request, pending: Pending) -> None:
        if self.sock is None:
            raise NotReady("the shared model process went away; retry shortly")
        self.pending[request.seq] = pending
        with self._queue_lock:
            self._outbox.append(request)
            full = len(self._outbox) >= FRAME_REQUESTS
            wake = not full and not self._due
            self._due = self._due or wake
        if full:
            self._flush()
        elif wake and self._wake is not None:  # else the writer, starting, looks first
            self._wake.set()

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._wake is not None:
            self._wake.set()  # the writer sees the link stopping

    def write(self) -> None:
        """The writer: what the outbox holds as one frame, at each wake-up, until the
        link stops."""
        wake = self._wake = self._new_signal()
        while True:
            # Cleared before the outbox is taken: a request queued after the take
            # wakes the writer again, one queued before it is in this frame.
            self._due = False
            if not self._flush() and self.stopping():
                return
            wake.wait(WRITER_IDLE_S)

    def _flush(self) -> bool:
        """Send what the outbox holds, if anything, as one frame; whether it held any."""
        # The send lock may be held across a send that waits for room in the socket
        # (the runtime's: under gevent a greenlet's); the queue lock only for a swap.
        with self._send_lock:
            with self._queue_lock:
                requests, self._outbox = self._outbox, []
            if requests:
                self._send(requests)
        return bool(requests)

    def _send(self, requests: list[Request]) -> None:
        sock = self.sock
        if sock is None:
            self._fail(requests, "the shared model process went away; retry shortly")
            return
        try:
            data = frame(requests)
        except Exception:
            requests = self._picklable(requests)
            if not requests:
                return
            data = frame(requests)
        try:
            sock.sendall(data)
        except OSError:
            # The reader sees the connection end too, and fails what is still in
            # flight on it; these, too, before it has.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            self._fail(requests, "the shared model process went away; retry shortly")

    def _picklable(self, requests: list[Request]) -> list[Request]:
        """The requests pickle can carry; the others' requests fail with what pickle
        raised, as a send of their own did."""
        kept = []
        for request in requests:
            try:
                frame([request])
            except Exception as error:
                _reject(self.pending.pop(request.seq, None), error)
            else:
                kept.append(request)
        return kept

    def _fail(self, requests: list[Request], message: str) -> None:
        for request in requests:
            _reject(self.pending.pop(request.seq, None), NotReady(message))

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
        frames = Frames()
        chunk = bytearray(READ_BYTES)
        with memoryview(chunk) as view:
            while True:
                try:
                    got = sock.recv_into(view)
                    if got == 0:
                        return
                    answers = frames.feed(view[:got])
                except (EOFError, OSError):
                    return
                except Exception:
                    # Which requests it answered is unknown: fail every one in flight
                    # (503, retried) rather than leave them waiting, and reconnect.
                    log.exception(
                        "an answer from the model process at %s was unreadable", self.path
                    )
                    return
                for batch in answers:
                    for answer in batch:
                        self._settle(answer)

    def _settle(self, answer: Answer) -> None:
        pending = self.pending.pop(answer.seq, None)
        if pending is None or pending.future.done():
            return  # its request gave up at its deadline
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
        # Queued for the connection that went: failed here, never sent to the next.
        with self._queue_lock:
            self._outbox = []
        pending, self.pending = self.pending, {}
        if pending and not self.stopping():
            log.warning(
                "the shared model process at %s went away with %d requests in flight",
                self.path,
                len(pending),
            )
        for one in pending.values():
            _reject(
                one,
                NotReady(
                    "the shared model process stopped while this request was in it; "
                    f"retry (request id {one.request_id})"
                ),
            )


def _reject(pending: Pending | None, error: BaseException) -> None:
    """Fail a request still waiting (one that gave up at its deadline is done)."""
    if pending is not None and not pending.future.done():
        with contextlib.suppress(Exception):  # cancelled meanwhile: nobody waits
            pending.future.set_exception(error)
