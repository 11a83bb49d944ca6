"""What crosses a model socket: frames of a 4-byte length and a pickle (protocol 5).

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

import os
import pickle
import socket
import struct
from typing import Any, NamedTuple

from serving_core.errors import ServingError

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


def send_frame(sock: socket.socket, message: Request | Answer) -> None:
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


def socket_path(directory: str, index: int = 0) -> str:
    """A model socket's path: short (a Unix socket path has ~107 bytes), one per model
    process of a server."""
    return os.path.join(directory, f"model-{os.getpid()}-{index}.sock")
