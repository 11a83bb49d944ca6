"""What crosses a model socket: frames of a 4-byte length and a pickle (protocol 5)
of a list of messages.

A frame carries every message its sender had ready: a worker's requests of one
turn of its loop, the model process's answers for that worker from one batch.
A frame per message cost each item a send and a wake-up at both ends, and a
pickle with its own header; one frame for many is a syscall and an unpickle
for all of them (issue 44: the model process's own CPU per item is what caps a
fast GPU).

Many requests are in flight on one connection, answered in any order by
sequence number. A request carries its id, its absolute ``time.monotonic()``
deadline and arrival (CLOCK_MONOTONIC is one clock for every process of a
machine), its worker's open client connections (the adaptive policy's
"everyone who could send has sent" counts the connections of every worker)
and its request span's ``traceparent``, which the batch's ``model`` span here
links to.

An answer carries the output, or the ``ServingError`` itself: errors pickle
with every field (``ServingError.__reduce__``), so a 503's ``Retry-After`` or a
handler's own error class reaches the worker as it was raised; and, traced,
when its batch began and that batch's span, for the worker's ``queue`` span.
Both ends are forked from one master, so they unpickle each other's classes.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
from typing import Any, NamedTuple

from serving_core.engine.pending import Pending
from serving_core.errors import ModelError, ServingError

log = logging.getLogger("serving_core.modelprocess.protocol")

MAX_FRAME_BYTES = 1 << 30
_LENGTH = struct.Struct("!I")


class Request(NamedTuple):
    """A worker's prepared item for the model process's batcher."""

    seq: int  # per connection; the answer's
    request_id: str
    deadline: float | None  # time.monotonic(), as in the worker
    arrival: float
    item: Any
    open_connections: int | None  # the worker's, for the adaptive policy
    traceparent: str | None = None  # the request's span; None with traces off


class Answer(NamedTuple):
    """The model's output for the request ``seq``, or the error it ended in."""

    seq: int
    output: Any
    error: ServingError | None
    batch_size: int  # 0 when it never ran in a batch
    started: float = 0.0  # time.monotonic() when its batch began; 0.0 when it never ran
    batch_span: str | None = None  # that batch's ``model`` span, traced


def frame(messages: list[Request] | list[Answer]) -> bytes:
    """One frame of ``messages``; raises what pickle raises for one it cannot carry."""
    payload = pickle.dumps(messages, protocol=5)
    return _LENGTH.pack(len(payload)) + payload


def answer_for(seq: int, pending: Pending) -> Answer:
    """The answer to request ``seq`` from its ``Pending``, resolved by the model thread."""
    future = pending.future
    if not future.done() or future.cancelled():  # never, unless the batcher has a bug
        return Answer(seq, None, ModelError("the shared model process dropped this request"), 0)
    exc = future.exception()
    if exc is not None:
        return Answer(seq, None, _serving_error(exc), 0)
    return Answer(
        seq, future.result(), None, pending.batch_size, pending.started, pending.batch_span
    )


def answers_frame(answers: list[Answer]) -> bytes:
    """One frame of ``answers``; an output (or an error's details) that pickle cannot
    carry is that request's ``ModelError``, and the others go as they are."""
    try:
        return frame(answers)
    except Exception:
        pass
    kept = []
    for answer in answers:
        try:
            pickle.dumps(answer, protocol=5)
            kept.append(answer)
        except Exception as error:
            log.exception("request %d: the answer could not be sent to its worker", answer.seq)
            kept.append(Answer(answer.seq, None, _serving_error(error), 0))
    return frame(kept)


def _serving_error(exc: BaseException) -> ServingError:
    if isinstance(exc, ServingError):
        return exc
    return ModelError(f"the shared model process failed: {type(exc).__name__}")


class Frames:
    """The frames of a byte stream, from its bytes as they arrive, in any pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[list[Any]]:
        """The messages of every frame ``data`` completes, frame by frame. ``EOFError``:
        a length no serving-core peer sends; what pickle raises for a frame it
        cannot read (both end the connection: the stream's place is lost)."""
        buffer = self._buffer
        buffer += data
        frames: list[list[Any]] = []
        start, size = 0, len(buffer)
        with memoryview(buffer) as view:
            while size - start >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(view, start)
                if length > MAX_FRAME_BYTES:
                    raise EOFError(f"a frame of {length} bytes: not a model connection's")
                end = start + _LENGTH.size + length
                if end > size:
                    break
                # In-band pickle 5 copies what it reads: nothing keeps the view.
                with view[start + _LENGTH.size : end] as payload:
                    frames.append(pickle.loads(payload))
                start = end
        del buffer[:start]
        return frames


def socket_path(directory: str, index: int = 0) -> str:
    """A model socket's path: short (a Unix socket path has ~107 bytes), one per model
    process of a server."""
    return os.path.join(directory, f"model-{os.getpid()}-{index}.sock")
