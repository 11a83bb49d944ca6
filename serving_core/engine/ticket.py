"""``Ticket``: one request's generation, between the decoder's thread and the request.

The decoder's thread puts each event (a chunk, the end, an error) as it comes;
the request takes them in order, waiting on a ``Signal`` of its ``Runtime``
when none is there yet (a greenlet's under the gevent worker: a native wait
would stall the worker's other requests), one signal for all its events.
``cancel`` is how the request lets go (its client hung up, or it stopped
reading): the decoder drops the generation before its next step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from serving_core.engine.stepper import Event
from serving_core.generation import Generation
from serving_core.runtime import Signal


class Ticket:
    def __init__(
        self,
        generation: Generation,
        *,
        arrival: float,
        ends_by: float,
        signal: Signal,
        on_cancel: Callable[[], None] = lambda: None,
    ) -> None:
        self.generation = generation
        self.arrival = arrival
        # When it must end, whatever it has left (SERVING_GENERATION_TIMEOUT_S).
        self.ends_by = ends_by
        self.cancelled = False
        self.done = False  # the decoder has put its last event
        self.last_chunk_at: float | None = None  # the decoder's, for the inter-token latency
        self.opened = time.monotonic()  # when it was queued to join
        self.traced = False  # its spans are drawn (``online.runner.decoding``), once
        self.joined_at: float | None = None
        self._on_cancel = on_cancel
        # deque's append and popleft are atomic: one thread puts, the other takes.
        self._events: deque[Event] = deque()
        self._signal = signal

    # -- the decoder's side ---------------------------------------------------

    def put(self, event: Event) -> None:
        self._events.append(event)
        self._signal.set()

    # -- the request's side ---------------------------------------------------

    def next(self, timeout_s: float) -> Event | None:
        """The next event, waiting at most ``timeout_s``; None if none came by then."""
        events = self._events
        if events:
            return events.popleft()
        deadline = time.monotonic() + timeout_s
        while True:
            # A signal left set by an event already taken wakes this at once: look again.
            self._signal.wait(max(0.0, deadline - time.monotonic()))
            if events:
                return events.popleft()
            if time.monotonic() >= deadline:
                return None

    def cancel(self) -> None:
        """Let go: the decoder drops it before its next step, and tells nobody. Counted
        (``on_cancel``) now, once, unless it had already ended."""
        if self.cancelled or self.done:
            return
        self.cancelled = True
        self._on_cancel()
