"""Noticing, on the gevent hub, that a waiting request's client has hung up."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from gevent.hub import get_hub

from serving_core.online.runner.base import ClientWatch

WATCH_AFTER_S = 0.05  # how long a request waits before its client's socket is watched


def watch_client(sock: Any, on_gone: Callable[[], None]) -> ClientWatch:
    """Call ``on_gone`` if the client closes its connection while its request waits for the
    model; returns what stops watching, and a peek for admission to ask before it
    refuses anyone (``WaitQueue.peek``: the watch below is late by design). An io
    watcher on the hub, so a wait costs nothing until the socket turns readable:
    then a peek, in the watcher's callback, and an end of stream (or a reset) means
    the client has gone. Data means a pipelined request, which says nothing: the
    watch ends there. Without this, the requests of clients that gave up (a storm's
    connections, closed) keep their places in the queue and the model runs them for
    nobody, while new requests are refused.

    The peek and ``on_gone`` run in the callback itself, not in a greenlet it
    spawns: a greenlet would run only after the rest of the loop's turn, and a
    newcomer woken in that turn would be refused by a queue its gone predecessors
    still fill. So ``on_gone`` must be cheap and must not wait
    (``Batcher.hung_up`` marks the item).

    The io watcher starts only once the request has waited ``WATCH_AFTER_S``:
    making one cost two system calls (libev checks the descriptor, then adds it
    to epoll, which already has it), and most requests are answered sooner. A
    client that hangs up is noticed that much later; a timer costs none."""
    try:
        fd = sock.fileno()
    except (AttributeError, OSError):
        return NOT_WATCHED
    if fd < 0:
        return NOT_WATCHED
    # gevent's socket would wait on the hub if the peek found nothing (a spurious
    # wake-up), which the hub cannot do: peek on the native socket, never waiting.
    native = getattr(sock, "_sock", sock)
    loop = get_hub().loop
    timer = loop.timer(WATCH_AFTER_S)
    watcher: Any = None

    def readable() -> None:
        gone = peek_hangup(native)
        if gone is None:
            return  # nothing to read after all: keep watching
        watcher.stop()
        if gone:
            on_gone()

    def watch() -> None:
        nonlocal watcher
        watcher = loop.io(fd, 1)  # 1: readable
        watcher.start(readable)

    def stop() -> None:
        timer.close()
        if watcher is not None:
            watcher.close()

    timer.start(watch)
    return ClientWatch(stop, lambda: bool(peek_hangup(native)))


def peek_hangup(native: socket.socket) -> bool | None:
    """Whether the client has hung up: an end of stream or a reset; False for data (a
    pipelined request, which says nothing); None when there is nothing to read."""
    try:
        return native.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return None
    except OSError:
        return True


NOT_WATCHED = ClientWatch(lambda: None, lambda: False)
