"""Noticing, on the gevent hub, that a waiting request's client has hung up."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import gevent
from gevent.hub import get_hub

WATCH_AFTER_S = 0.05  # how long a request waits before its client's socket is watched


def watch_client(sock: Any, on_gone: Callable[[], None]) -> Callable[[], None]:
    """Call ``on_gone`` if the client closes its connection while its request waits
    for the model; returns what stops watching. An io watcher on the hub, so a wait
    costs nothing until the socket turns readable: then a greenlet peeks, and an
    end of stream (or a reset) means the client has gone. Data means a pipelined
    request, which says nothing: the watch ends there. Without this, the requests
    of clients that gave up (a storm's connections, closed) keep their places in
    the queue and the model runs them for nobody, while new requests are refused.

    The io watcher starts only once the request has waited ``WATCH_AFTER_S``:
    making one cost two system calls (libev checks the descriptor, then adds it
    to epoll, which already has it), and most requests are answered sooner. A
    client that hangs up is noticed that much later; a timer costs none."""
    try:
        fd = sock.fileno()
    except (AttributeError, OSError):
        return _nothing
    if fd < 0:
        return _nothing
    loop = get_hub().loop
    timer = loop.timer(WATCH_AFTER_S)
    watcher: Any = None

    def peek() -> None:
        try:
            gone = sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            gone = True
        if gone:
            on_gone()

    def readable() -> None:
        watcher.stop()
        gevent.spawn(peek)

    def watch() -> None:
        nonlocal watcher
        watcher = loop.io(fd, 1)  # 1: readable
        watcher.start(readable)

    def stop() -> None:
        timer.close()
        if watcher is not None:
            watcher.close()

    timer.start(watch)
    return stop


def _nothing() -> None:
    pass
