"""A generating handler's runner: the worker's decoder thread, continuous batching.

``open`` queues one request's generation and hands back its ``Ticket``, whose
events the request streams (``online.streamed``); ``run`` collects every chunk
into one answer (``/predict`` without a stream, V2's ``infer``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from serving_core.context import Context
from serving_core.engine.decoder import Decoder
from serving_core.engine.engine import Engine
from serving_core.engine.observer import GenerationObserver
from serving_core.engine.stepper import Chunk, Event, collect
from serving_core.engine.ticket import Ticket
from serving_core.engine.watchdog import Watched
from serving_core.errors import DeadlineExceeded
from serving_core.handler import Output
from serving_core.online.runner.base import Computed, WatchGone
from serving_core.runtime import Runtime
from serving_core.tracing.tracer import tracer


class DecodingRunner:
    model_thread: Watched | None = None  # set to the decoder: the watchdog watches it

    def __init__(
        self,
        engine: Engine,
        *,
        max_queue: int,
        generation_timeout_s: float,
        margin_s: float,
        observer: GenerationObserver | None,
        runtime: Runtime,
    ) -> None:
        if engine.stepper is None:
            raise ValueError("DecodingRunner serves a generating handler only")
        self.engine = engine
        self.decoder = Decoder(
            engine.stepper,
            max_running=engine.max_batch_size,
            max_queue=max_queue,
            observer=observer,
        )
        self.decoder.new_signal = runtime.new_signal
        self.model_thread = self.decoder
        self.generation_timeout_s = generation_timeout_s
        # How much longer than the decoder's own ends a request waits for an event:
        # the decoder tells the end itself; this bounds a wait on a stuck step.
        self.margin_s = margin_s
        self.started = False

    def start(self, warm_up: Callable[[], object] | None) -> None:
        self.started = True
        self.decoder.start()
        if warm_up is not None:
            warm_up()

    def stop(self, timeout_s: float) -> bool:
        return self.decoder.stop(timeout_s)

    def admit(self, deadline: float) -> None:
        self.decoder.admit(deadline)

    def open(self, item: Any, ctx: Context, *, arrival: float, max_tokens: int) -> Ticket:
        return self.decoder.open(
            item,
            ctx,
            max_tokens=max_tokens,
            arrival=arrival,
            ends_by=arrival + self.generation_timeout_s,
        )

    def wait_s(self, ticket: Ticket, now: float) -> float:
        """How long the request waits for its next event before it gives up."""
        due = ticket.ends_by
        if ticket.last_chunk_at is None and ticket.generation.context.deadline is not None:
            due = min(due, ticket.generation.context.deadline)
        return max(0.0, due - now) + self.margin_s

    def run(self, item: Any, ctx: Context, *, arrival: float, watch: WatchGone | None) -> Computed:
        """One generation's chunks collected (``Handler.collect``), within SERVING_MAX_TOKENS
        (``Service.compute`` asks ``generate`` with the request's own ``max_tokens``)."""
        limit = self.engine.max_tokens
        chunks = self.generate(item, ctx, arrival=arrival, max_tokens=limit, watch=watch)
        return Computed(self.engine.collect(chunks, ctx), None)

    def generate(
        self, item: Any, ctx: Context, *, arrival: float, max_tokens: int, watch: WatchGone | None
    ) -> list[Output]:
        """Every chunk of one generation; raise its error, or a deadline's. A client that
        hangs up meanwhile ends it (``watch``)."""
        ticket = self.open(item, ctx, arrival=arrival, max_tokens=max_tokens)
        watching = watch(ticket.cancel) if watch is not None else None
        try:
            return collect(self.events(ticket))[0]
        finally:
            if watching is not None:
                watching.stop()

    def events(self, ticket: Ticket) -> Iterator[Event]:
        """``ticket``'s events as they come, to its last."""
        chunks = 0
        try:
            while True:
                event = self.next_event(ticket)
                yield event
                if not isinstance(event, Chunk):
                    return
                chunks += 1
        finally:  # its last event, an error, or a reader that let go
            trace_generation(ticket, chunks)

    def next_event(self, ticket: Ticket) -> Event:
        """``ticket``'s next event; a ``DeadlineExceeded`` (the generation let go) when
        none comes within its deadline and the margin."""
        event = ticket.next(self.wait_s(ticket, time.monotonic()))
        if event is None:
            ticket.cancel()
            return DeadlineExceeded(
                "no token within the generation's deadline; retry later or ask for fewer tokens"
            )
        return event

    @property
    def ready(self) -> bool:
        return self.decoder.alive

    @property
    def fault(self) -> str | None:
        return self.decoder.fault

    def describe(self) -> dict[str, Any]:
        return self.decoder.describe()


def trace_generation(ticket: Ticket, chunks: int) -> None:
    """A generation's spans, drawn once it has ended (``events``, ``Streamed.close``):
    its wait to join the running ones (``queue``) and its steps (``generate``), under its
    request's span, named explicitly: a stream's events are read after the request's
    span has ended."""
    traces = tracer()
    if not traces.enabled or ticket.traced:
        return
    ticket.traced = True
    parent = ticket.generation.context.traceparent
    now = time.monotonic()
    joined = ticket.joined_at if ticket.joined_at is not None else now
    traces.start("queue", parent=parent, at=ticket.opened).end(at=joined)
    generated = traces.start("generate", parent=parent, at=joined)
    generated.set("serving.generation.chunks", chunks)
    generated.set("serving.generation.cancelled", ticket.cancelled)
    generated.end(at=now)
