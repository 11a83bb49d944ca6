"""``Ticket``: one request's generation, between the decoder's thread and the request.

The decoder's thread puts each event (a chunk, the end, an error) as it comes;
the request takes them in order, waiting on a future of its ``Runtime`` when
none is there yet (a greenlet under the gevent worker: a native wait would
stall the worker's other requests). ``cancel`` is how the request lets go (its
client hung up, or it stopped reading): the decoder drops the generation
before its next step.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from serving_core.engine.stepper import Event
from serving_core.generation import Generation


class Ticket:
    def __init__(
        self,
        generation: Generation,
        *,
        arrival: float,
        ends_by: float,
        new_future: Callable[[], Future[Any]],
        on_cancel: Callable[[], None] = lambda: None,
    ) -> None:
        self.generation = generation
        self.arrival = arrival
        self.ends_by = (
            ends_by  # when it must end, whatever it has left (SERVING_GENERATION_TIMEOUT_S)
        )
        self.cancelled = False
        self.done = False  # the decoder has put its last event
        self._on_cancel = on_cancel
        self.last_chunk_at: float | None = None  # the decoder's, for the inter-token latency
        self.joined_at: float | None = None
        self._new_future = new_future
        self._events: deque[Event] = deque()
        self._waiter: Future[Any] | None = None
        # Held for a few instructions by either side, never across a wait.
        self._lock = threading.Lock()

    # -- the decoder's side ---------------------------------------------------

    def put(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.set_result(None)

    # -- the request's side ---------------------------------------------------

    def next(self, timeout_s: float) -> Event | None:
        """The next event, waiting at most ``timeout_s``; None if none came by then."""
        with self._lock:
            if self._events:
                return self._events.popleft()
            waiter = self._waiter = self._new_future()
        with contextlib.suppress(FutureTimeout):
            waiter.result(timeout=timeout_s)
        with self._lock:
            self._waiter = None
            return self._events.popleft() if self._events else None

    def cancel(self) -> None:
        """Let go: the decoder drops it before its next step, and tells nobody. Counted
        (``on_cancel``) now, once, unless it had already ended."""
        if self.cancelled or self.done:
            return
        self.cancelled = True
        self._on_cancel()
