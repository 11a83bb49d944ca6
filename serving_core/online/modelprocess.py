"""The shared model process: one process owns the model (and the GPU); every worker feeds it.

    master   preload: import the handler, ``setup()`` (weights on the CPU, shared by
             fork; nothing touches CUDA here) → fork the HTTP workers, and
             ``ModelProcess.start`` forks the model process; a watcher thread forks
             it again whenever it dies
    model    ``setup_worker()`` (the handler moves its model to the device: CUDA is
             initialised here only) → a ``Batcher`` over the ``Engine``, with the
             same policy, admission and deadlines as a worker's → the sample as
             warm-up → listen on a Unix socket: a reader and a writer thread per
             worker connection
    worker   validate and ``preprocess`` (tokenising) in the request, as always →
             ``RemoteBatcher.submit`` sends the prepared item → a reader resolves
             the request's future with the model's output → ``postprocess`` here

SERVING_MODEL_PROCESS=shared. Per-worker (the default on CPU) gives each worker
its own model thread; on a GPU that means a CUDA context and a model copy per
worker, time-slicing the card into small, slow batches. Here one batcher sees
every worker's requests, so batches are as large as the load allows.

The wire: frames of a 4-byte length and a pickle (protocol 5), many requests
in flight on one connection, answered in any order by sequence number. A
request carries its id, its absolute ``time.monotonic()`` deadline and arrival
(CLOCK_MONOTONIC is one clock for every process of a machine) and its worker's
open client connections: the adaptive policy's "everyone who could send has
sent" counts the connections of every worker.

Why not gunicorn's dirty arbiter (gunicorn 25+, a process pool for models):
its client runs one call at a time per connection, through the arbiter
process and then a dirty worker (two hops), so a worker could not keep the
many requests in flight that batching across workers needs.

If the model process dies, each worker fails its requests in flight with 503
``not_ready``, its ``/readyz`` turns 503, and it reconnects when the watcher
has forked a new one (after ``RESPAWN_PAUSE_S``). Imports no Flask.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import pickle
import queue
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from serving_core import errors
from serving_core.context import Context
from serving_core.engine.batcher import Batcher
from serving_core.engine.core import Engine
from serving_core.engine.observer import Observer
from serving_core.engine.pending import Pending
from serving_core.engine.policy import make_policy
from serving_core.errors import NotReady, ServingError
from serving_core.runtime import THREADS, Runtime
from serving_core.settings import Settings

log = logging.getLogger("serving_core.online.modelprocess")

_LENGTH = struct.Struct("!I")
MAX_FRAME_BYTES = 1 << 30
RESPAWN_PAUSE_S = 1.0  # between forks of a model process that keeps dying
RECONNECT_PAUSE_S = 0.05  # a worker's retry while the model process (re)starts
WARM_UP_TIMEOUT_S = 600.0
# The master's word to stop: SIGTERM is ignored in the model process, since a
# SIGTERM to the whole process group (docker stop, a terminal's Ctrl-C, a test)
# reaches it while the workers still drain through it; gunicorn's master stops
# it with this once every worker has gone (on_exit).
STOP_SIGNAL = signal.SIGUSR2
PARENT_CHECK_S = 1.0  # how often the model process looks for its master
MASTER_SIGNALS = (
    signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGWINCH, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)  # fmt: skip


# -- frames ---------------------------------------------------------------------


def send_frame(sock: socket.socket, message: Any) -> None:
    payload = pickle.dumps(message, protocol=5)
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket) -> Any:
    """The next message, or ``EOFError`` when the peer closed the connection."""
    (length,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise EOFError(f"a frame of {length} bytes: not a serving-core model connection")
    return pickle.loads(_recv_exactly(sock, length))


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError("the connection closed")
        got += n
    return bytes(buffer)


def _error_message(exc: BaseException) -> tuple[str, str, Any, float | None, str | None]:
    """A ``ServingError`` as plain values: exceptions with keyword-only arguments do
    not survive pickling."""
    if not isinstance(exc, ServingError):
        exc = errors.ModelError(f"the shared model process failed: {type(exc).__name__}")
    return (
        type(exc).__name__,
        exc.message,
        exc.details,
        exc.retry_after_s,
        getattr(exc, "reason", None),
    )


def _rebuild_error(values: tuple[str, str, Any, float | None, str | None]) -> ServingError:
    name, message, details, retry_after_s, reason = values
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, ServingError)):
        return errors.ModelError(message)
    if cls is errors.Overloaded:
        return errors.Overloaded(
            message, reason=reason or "queue_full", retry_after_s=retry_after_s or 1.0
        )
    return cls(message, details=details, retry_after_s=retry_after_s)


# -- the model process ------------------------------------------------------------


class ModelServer:
    """In the model process: the batcher over the engine, fed by every worker connection."""

    def __init__(self, engine: Engine, settings: Settings, observer: Observer | None) -> None:
        self.engine = engine
        self._open: dict[int, int] = {}  # connection id -> its worker's open connections
        policy = make_policy(
            settings.batch_policy,
            max_batch_size=engine.max_batch_size,
            max_wait_ms=settings.max_wait_ms if engine.batched else 0.0,
            open_connections=self.open_connections,
        )
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
        answers: queue.SimpleQueue[tuple[int, Pending] | None] = queue.SimpleQueue()
        writer = threading.Thread(
            target=self._write, args=(conn, answers), name=f"model-write-{number}", daemon=True
        )
        writer.start()
        try:
            while True:
                try:
                    seq, request_id, deadline, arrival, item, open_connections = recv_frame(conn)
                except (EOFError, OSError):
                    return
                if open_connections is not None:
                    self._open[number] = open_connections
                ctx = Context(request_id, deadline)
                try:
                    pending = self.batcher.submit(item, ctx, arrival=arrival)
                except ServingError as exc:
                    refused = Pending(item, ctx, arrival)
                    refused.future.set_exception(exc)
                    answers.put((seq, refused))
                    continue
                pending.future.add_done_callback(functools.partial(_answer, answers, seq, pending))
        finally:
            self._open.pop(number, None)
            answers.put(None)
            writer.join()
            conn.close()

    def _write(
        self, conn: socket.socket, answers: queue.SimpleQueue[tuple[int, Pending] | None]
    ) -> None:
        # Its own thread: pickling and sending never run on the model thread,
        # which resolves the futures and goes straight on to the next batch.
        while (answer := answers.get()) is not None:
            seq, pending = answer
            exc = pending.future.exception()
            message = (
                (seq, True, pending.future.result(), pending.batch_size)
                if exc is None
                else (seq, False, _error_message(exc), 0)
            )
            try:
                send_frame(conn, message)
            except OSError:
                return  # the worker went away; its reader ends the connection
            except Exception as error:  # an output pickle cannot carry
                log.exception("request %d: the output could not be sent to its worker", seq)
                with contextlib.suppress(OSError):
                    send_frame(conn, (seq, False, _error_message(error), 0))


def _answer(
    answers: queue.SimpleQueue[tuple[int, Pending] | None],
    seq: int,
    pending: Pending,
    future: Future[Any],
) -> None:
    answers.put((seq, pending))


class ModelProcess:
    """The master's handle on the shared model process: forks it, and again when it dies."""

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
        """``device``: this model process's, for the handler's ``self.device`` (one
        GPU each when there are several); ``processes``: how many model processes
        share the cores the workers leave."""
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
            # gunicorn's master handlers would write to the master's pipe.
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
    from serving_core.cores import usable_cores
    from serving_core.threads import set_model_threads

    # The cores the workers leave, at least one, for torch's intra-op pool: a
    # torch thread that has to share its core with a worker's hub collapses
    # (OpenMP threads spin and wait on each other; a 15 ms call took 500 ms).
    set_model_threads(max(1, (usable_cores() - settings.workers) // processes))
    engine.handler.setup_worker()
    server = ModelServer(engine, settings, observer)
    server.batcher.start()
    server.warm_up(sample)
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


# -- in each worker ------------------------------------------------------------------


class SharedPolicy:
    """What ``/metadata`` shows of the batching when the model process batches."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = list(paths)

    def describe(self) -> dict[str, Any]:
        return {"model_process": "shared", "model_processes": len(self.paths)}


class RemoteBatcher:
    """A worker's stand-in for its ``Batcher``: the same ``submit`` and futures, served
    by the shared model process (or processes: one per GPU) over one connection each,
    with many requests in flight on it. A request goes to the connected model process
    with the fewest of this worker's requests in flight."""

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        max_queue: int = 1 << 30,
        observer: Observer | None = None,
        open_connections: Callable[[], int | None] = lambda: None,
        runtime: Runtime = THREADS,
    ) -> None:
        paths = [paths] if isinstance(paths, str) else list(paths)
        self.runtime = runtime
        self.max_queue = max_queue
        self.policy = SharedPolicy(paths)
        self.fault: str | None = None  # a worker-side model thread's; never set here
        self._observer = observer
        self._open_connections = open_connections
        self._seq = itertools.count()
        self._stopping = False
        self._links = [_Link(path, lambda: self._stopping, runtime) for path in paths]

    # -- the Batcher interface the service uses -------------------------------

    def start(self) -> None:
        for link in self._links:
            # A greenlet under gevent: the worker's sockets are gevent's, read on its hub.
            self.runtime.spawn(link.run)

    def wait_connected(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        return all(
            link.connected.wait(max(0.0, deadline - time.monotonic())) for link in self._links
        )

    def admit(self, deadline: float) -> None:
        """What this worker can refuse before a request's body is read: no model
        process, or its own share of the queue (SERVING_MAX_QUEUE) in flight. The
        model process applies the rest of admission when the item arrives."""
        self._pick()

    def _pick(self) -> _Link:
        up = [link for link in self._links if link.sock is not None]
        if not up or self._stopping:
            raise NotReady(
                "the shared model process is not up (starting, or restarting after a "
                "failure); retry after /readyz answers 200"
            )
        if self.depth >= self.max_queue:
            self.rejected("queue_full")
            raise errors.Overloaded(
                f"{self.depth} requests of this worker are in the shared model "
                "process; retry after the Retry-After delay",
                reason="queue_full",
                retry_after_s=1.0,
            )
        return min(up, key=lambda link: len(link.pending))

    def withdraw(self, pending: Pending) -> None:
        """The request gave up at its deadline. Its item stays in the model process,
        which drops it unrun once the deadline has passed, and answers it anyway."""
        pending.future.cancel()

    def submit(self, item: Any, context: Context, *, arrival: float) -> Pending:
        link = self._pick()
        pending = Pending(
            item, context, arrival, enqueued=time.monotonic(), future=self.runtime.new_future()
        )
        message = (
            next(self._seq),
            context.request_id,
            context.deadline,
            arrival,
            item,
            self._open_connections(),
        )
        link.send(message, pending)
        return pending

    def rejected(self, reason: str) -> None:
        if self._observer is not None:
            self._observer.rejected(reason)

    @property
    def alive(self) -> bool:
        """Ready while every model process is connected: one that is down turns this
        worker's /readyz red (the others still serve what reaches the worker)."""
        return not self._stopping and all(link.sock is not None for link in self._links)

    @property
    def depth(self) -> int:
        return sum(len(link.pending) for link in self._links)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Refuse new requests, wait for the answers in flight, close the connections."""
        self._stopping = True
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else 30.0)
        while self.depth and time.monotonic() < deadline:
            time.sleep(0.01)
        drained = not self.depth
        for link in self._links:
            link.close()
        return drained


class _Link:
    """One worker's connection to one model process, and its requests in flight."""

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

    def send(self, message: tuple[Any, ...], pending: Pending) -> None:
        sock = self.sock
        seq = message[0]
        self.pending[seq] = pending
        try:
            if sock is None:
                raise OSError("not connected")
            with self._send_lock:
                send_frame(sock, message)
        except OSError:
            self.pending.pop(seq, None)
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
                seq, ok, value, batch_size = recv_frame(sock)
            except (EOFError, OSError):
                return
            pending = self.pending.pop(seq, None)
            if pending is None or pending.future.done():
                continue  # its request gave up at its deadline
            pending.batch_size = batch_size
            with contextlib.suppress(Exception):  # cancelled meanwhile: nobody waits
                if ok:
                    pending.future.set_result(value)
                else:
                    pending.future.set_exception(_rebuild_error(value))

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


def socket_path(directory: str, index: int = 0) -> str:
    """A model socket's path: short (a Unix socket path has ~107 bytes), one per model
    process of a server."""
    return os.path.join(directory, f"model-{os.getpid()}-{index}.sock")
