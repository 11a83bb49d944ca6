"""A real server of the generating test handler (tests/handlers/generating) for the
text fronts' end-to-end tests, and a way to fill its one worker's queue."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import requests

from tests.conftest import HANDLERS, make_app
from tests.servers import Server

GENERATING = str(HANDLERS / "generating" / "handler.py")
# One worker, one generation running and one waiting: a third is refused (503).
ENV = {
    "SERVING_HANDLER": GENERATING,
    "SERVING_WORKERS": "1",
    "SERVING_MAX_BATCH_SIZE": "1",
    "SERVING_MAX_QUEUE": "1",
}
WAIT_S = 30.0


@contextlib.contextmanager
def full_queue(server: Server, gate: Path, headers: Mapping[str, str]) -> Iterator[None]:
    """While inside: one generation runs, held at its second step until ``gate``
    exists, and another waits to join, so the worker's queue is full."""
    base = f"{server.url}/v2/models/generating"
    held = requests.post(
        f"{base}/generate_stream",
        json={"text_input": "held", "parameters": {"gate": str(gate), "n": 2}},
        headers=dict(headers),
        stream=True,
        timeout=WAIT_S,
    )
    waiter = threading.Thread(
        target=requests.post,
        args=(f"{base}/generate",),
        kwargs={"json": {"text_input": "waits"}, "headers": dict(headers), "timeout": WAIT_S},
    )
    try:
        assert held.status_code == 200, held.text
        first = next(line for line in held.iter_lines() if line)
        assert b"held" in first  # its first chunk: it is at its gated step now
        waiter.start()
        _wait_for_waiting(server, headers)
        yield
    finally:
        gate.touch()
        if waiter.is_alive() or waiter.ident is not None:
            waiter.join(WAIT_S)
        held.close()


def _wait_for_waiting(server: Server, headers: Mapping[str, str]) -> None:
    """Until the worker's decoder has a generation waiting to join (``/metadata``)."""
    until = time.monotonic() + WAIT_S
    while time.monotonic() < until:
        meta = requests.get(f"{server.url}/metadata", headers=dict(headers), timeout=WAIT_S)
        if meta.json()["batching"]["waiting"] >= 1:
            return
        time.sleep(0.02)
    raise AssertionError("no generation came to wait behind the held one")


@contextlib.contextmanager
def started_client() -> Iterator[Any]:
    """A Flask test client of the generating handler's app, its worker started."""
    app = make_app(GENERATING, max_wait_ms=1)
    service = app.extensions["serving_core"]
    service.start()
    try:
        yield app.test_client()
    finally:
        service.stop()
