"""``Streamed``: one request's generation as its front sends it, event by event.

The door opens it (``FrontDoor.open_stream``) and waits for the first event
before the front answers: an error before any chunk (a refusal, a deadline, a
bad request) is then an ordinary HTTP or gRPC error with its status. After
that the front iterates: chunks, then the end (``End``, its reason) or an
error, which the front sends as its last event. However the iteration ends (the
end, an error, the client hanging up, the front giving up), ``close`` lets the
generation go, so the decoder drops it before its next step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from serving_core.context import Context
from serving_core.engine.stepper import Chunk, Event
from serving_core.engine.ticket import Ticket
from serving_core.errors import ServingError
from serving_core.online.runner.base import ClientWatch, WatchGone
from serving_core.online.runner.decoding import DecodingRunner, trace_generation


class Streamed:
    def __init__(self, runner: DecodingRunner, ticket: Ticket) -> None:
        self._runner = runner
        self._ticket = ticket
        self._first: Event | None = None
        self._ended = False
        self.watching: ClientWatch | None = None
        self.chunks = 0  # sent so far, for a front's usage counts

    @classmethod
    def open(
        cls,
        runner: DecodingRunner,
        item: Any,
        ctx: Context,
        *,
        arrival: float,
        max_tokens: int,
        watch: WatchGone | None,
    ) -> Streamed:
        """Open a generation on ``runner`` and wait for its first event; a client that
        hangs up meanwhile, or later, lets it go (``watch``)."""
        streamed = cls(runner, runner.open(item, ctx, arrival=arrival, max_tokens=max_tokens))
        if watch is not None:
            streamed.watching = watch(streamed._ticket.cancel)
        streamed.start()
        return streamed

    @property
    def request_id(self) -> str:
        return self._ticket.generation.context.request_id

    def start(self) -> None:
        """Wait for the first event; raise it if it is an error (nothing is sent yet)."""
        event = self._next()
        if isinstance(event, ServingError):
            self.close()
            raise event
        self._first = event

    def __iter__(self) -> Iterator[Event]:
        """The events: chunks, then an ``End`` or a ``ServingError``, the last."""
        try:
            event = self._first if self._first is not None else self._next()
            self._first = None
            while True:
                if isinstance(event, Chunk):
                    self.chunks += 1
                    yield event
                    event = self._next()
                    continue
                self._ended = True
                yield event
                return
        finally:
            self.close()

    def close(self) -> None:
        """Let the generation go (the decoder drops it before its next step)."""
        if not self._ended:
            self._ticket.cancel()
        trace_generation(self._ticket, self.chunks)
        if self.watching is not None:
            self.watching.stop()
            self.watching = None

    def _next(self) -> Event:
        return self._runner.next_event(self._ticket)
