"""In the model process: the batcher over the engine, and one thread that reads and
writes every worker's connection.

The I/O thread waits on every connection at once (``selectors``): a readable
connection's frames are each a worker's burst of requests, queued in the
batcher with one wake-up of the model thread for all that one round of the
loop read. The model thread hands each batch it has ended to the I/O thread
(``AnsweringBatcher``: no callback per item) and wakes it once; the I/O
thread writes each worker's answers of that batch as one frame. A thread
pair per connection cost each item a wake-up of its reader and its writer, a
frame and a send of its own, and the GIL handed between them all: ~120 µs of
the model process's CPU an item against ~45 now (issue 44).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from serving_core.context import Context
from serving_core.engine.batcher import Batcher
from serving_core.engine.engine import Engine
from serving_core.engine.modelthread import RunBatch
from serving_core.engine.observer import Observer
from serving_core.engine.pending import Pending
from serving_core.engine.policy import policy_for
from serving_core.errors import ServingError
from serving_core.modelprocess.protocol import Answer, Frames, Request, answer_for, answers_frame
from serving_core.settings import Settings

log = logging.getLogger("serving_core.modelprocess.server")

WARM_UP_TIMEOUT_S = 600.0
READ_BYTES = 1 << 18


class Connection:
    """One worker's connection: what it has sent of a frame, what is left to send it."""

    __slots__ = ("closed", "frames", "number", "out", "sock", "writing")

    def __init__(self, sock: socket.socket, number: int) -> None:
        self.sock = sock
        self.number = number
        self.frames = Frames()
        self.out = bytearray()
        self.writing = False  # waiting for room in the socket to send ``out``
        self.closed = False


class ModelServer:
    """The batcher over the engine; one I/O thread (``serve``) for every connection."""

    def __init__(self, engine: Engine, settings: Settings, observer: Observer | None) -> None:
        self.engine = engine
        self._open: dict[int, int] = {}  # connection number -> its worker's open connections
        policy = policy_for(settings, engine, open_connections=self.open_connections)
        # Every worker's requests share one queue: SERVING_MAX_QUEUE per worker, in all.
        self.batcher = AnsweringBatcher(
            engine.run,
            answered=self._answered,
            policy=policy,
            max_batch_size=engine.max_batch_size,
            max_queue=settings.max_queue * settings.workers,
            observer=observer,
            name="serving-model-process",
        )
        self._selector = selectors.DefaultSelector()
        # The batches ended, for the I/O thread to answer (None: every item failed at
        # once, ``Batcher.abandon``); the model thread's only hand-over, one a batch.
        self._ended: deque[list[Pending] | None] = deque()
        # The I/O thread's own: where each queued item's answer goes, and the
        # refusals of this round.
        self._routes: dict[Pending, tuple[Connection, int]] = {}
        self._refused: list[tuple[Connection, Answer]] = []
        # The I/O thread has been woken for what ``_ended`` holds: one wake-up a batch.
        self._signalled = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._wake_batcher: Callable[[], None] | None = None
        self._listening = True

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

    def stop_listening(self) -> None:
        """From another thread: accept no more connections; serve those there are."""
        self._listening = False
        self._wake()

    def serve(self, listener: socket.socket) -> None:
        """The I/O thread: accept, read and write every worker connection, for good."""
        listener.setblocking(False)
        selector = self._selector
        selector.register(listener, selectors.EVENT_READ)
        selector.register(self._wake_read, selectors.EVENT_READ)
        # What one round of the loop reads reaches the model thread with one wake-up
        # (a full batch wakes it at once: ``Batcher.submit``).
        self.batcher.defer_wake = self._defer_wake
        chunk = bytearray(READ_BYTES)
        with memoryview(chunk) as view:
            while True:
                for key, events in selector.select():
                    conn = key.data
                    if conn is None:
                        if key.fileobj is listener:
                            self._accept(listener)
                        else:
                            with contextlib.suppress(BlockingIOError):
                                os.read(self._wake_read, 4096)
                    elif not conn.closed:
                        try:
                            if events & selectors.EVENT_READ:
                                self._read(conn, view)
                            if events & selectors.EVENT_WRITE and not conn.closed:
                                self._flush(conn)
                        except Exception:
                            # A bug here must not end the thread every worker needs:
                            # that worker reconnects, its requests in flight failed.
                            log.exception("a worker's connection failed; closing it")
                            self._close(conn)
                wake, self._wake_batcher = self._wake_batcher, None
                if wake is not None:
                    wake()
                try:
                    self._answer()
                except Exception:
                    log.exception("the model process could not send its answers")
                if not self._listening and listener.fileno() >= 0:
                    selector.unregister(listener)
                    listener.close()

    def _defer_wake(self, wake: Callable[[], None]) -> None:
        self._wake_batcher = wake

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a byte there already wakes it
            os.write(self._wake_write, b"\0")

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:  # none left to accept (BlockingIOError), or closed
                return
            sock.setblocking(False)
            conn = Connection(sock, next(_numbers))
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: Connection, view: memoryview) -> None:
        try:
            got = conn.sock.recv_into(view)
            if got == 0:
                self._close(conn)
                return
            frames = conn.frames.feed(view[:got])
        except BlockingIOError:
            return
        except (EOFError, OSError):
            self._close(conn)
            return
        except Exception:
            # Not a request this model process can read: that worker sees the
            # connection close, fails its requests in flight, and reconnects.
            log.exception("a worker's request could not be read; closing its connection")
            self._close(conn)
            return
        for requests in frames:
            for request in requests:
                self._submit(conn, request)

    def _submit(self, conn: Connection, request: Request) -> None:
        if request.open_connections is not None:
            self._open[conn.number] = request.open_connections
        ctx = Context(request.request_id, request.deadline, request.traceparent)
        try:
            pending = self.batcher.submit(request.item, ctx, arrival=request.arrival)
        except ServingError as exc:  # refused at admission: answered this round
            self._refused.append((conn, Answer(request.seq, None, exc, 0)))
            return
        # Before the model thread can end its batch: only this thread reads the routes.
        self._routes[pending] = (conn, request.seq)

    def _answered(self, batch: list[Pending] | None) -> None:
        """On the model thread, once a batch has ended (None: once every item was
        failed): hand it to the I/O thread and wake it, once for the whole batch.
        Woken at each answer, it took the GIL from the model thread and sent the
        batch a few answers at a time."""
        self._ended.append(batch)
        # The I/O thread clears ``_signalled`` before it looks at what has ended.
        if not self._signalled:
            self._signalled = True
            self._wake()

    def _answer(self) -> None:
        """Send the answers of the batches ended and of this round's refusals, a
        frame per connection."""
        self._signalled = False
        ended, routes = self._ended, self._routes
        if not ended and not self._refused:
            return
        answers: dict[Connection, list[Answer]] = {}
        for conn, answer in self._refused:
            answers.setdefault(conn, []).append(answer)
        self._refused.clear()
        while ended:
            batch = ended.popleft()
            if batch is None:
                batch = [pending for pending in routes if pending.future.done()]
            for pending in batch:
                route = routes.pop(pending, None)
                if route is None:
                    continue  # the warm-up's
                conn, seq = route
                if not conn.closed:
                    answers.setdefault(conn, []).append(answer_for(seq, pending))
        for conn, batch_answers in answers.items():
            conn.out += answers_frame(batch_answers)
            self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._close(conn)  # the worker went away
            return
        del conn.out[:sent]
        writing = bool(conn.out)
        if writing != conn.writing:
            # Full (the worker slow to read): the rest when there is room.
            conn.writing = writing
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
            self._selector.modify(conn.sock, events, conn)

    def _close(self, conn: Connection) -> None:
        conn.closed = True
        self._open.pop(conn.number, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()


_numbers = itertools.count()


class AnsweringBatcher(Batcher):
    """The model process's batcher: it hands each batch over once its items are all
    answered (``answered``), so no item needs a callback of its own."""

    def __init__(
        self,
        run_batch: RunBatch,
        *,
        answered: Callable[[list[Pending] | None], None],
        **options: Any,
    ) -> None:
        super().__init__(run_batch, **options)
        self._answered = answered
        self._taken: list[Pending] = []

    def take(self) -> list[Pending] | None:
        batch = super().take()
        self._taken = batch or []
        return batch

    def finished(self) -> None:
        super().finished()
        batch, self._taken = self._taken, []
        self._answered(batch)

    def abandon(self, reason: str) -> None:
        super().abandon(reason)
        self._answered(None)  # everything queued and running, failed
