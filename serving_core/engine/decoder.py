"""The decoder: a worker's one thread that runs a generating handler's steps, with
continuous batching.

Requests ``open`` a generation and wait on its ``Ticket``. Between two steps
the thread lets the waiting ones join, up to SERVING_MAX_BATCH_SIZE running,
and drops those that ended, whose client hung up (``Ticket.cancel``) or whose
time ran out; then one ``Stepper.step`` runs every generation still running.
So a new request waits for one step, not for the longest sequence, and one
that ends leaves at once. It is ours rather than a library's because the
schedule, admission and deadlines are the product, as the batcher's are for
one-shot handlers.

Admission predicts a newcomer's time to its first chunk from what the thread
has measured (a step's duration, how long a generation holds its place) and
refuses at once (``503`` with ``Retry-After``) one that would miss its
deadline, as the batcher does. Imports no Flask.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from serving_core.context import Context
from serving_core.engine.forecast import Forecast
from serving_core.engine.observer import GenerationObserver, NoGenerationObserver
from serving_core.engine.stepper import Answer, Chunk, End, Stepper, ends
from serving_core.engine.ticket import Ticket
from serving_core.errors import DeadlineExceeded, NotReady, Overloaded, ServingError
from serving_core.generation import Generation
from serving_core.runtime import Signal, ThreadSignal

log = logging.getLogger("serving_core.engine.decoder")

Clock = Callable[[], float]


class Decoder:
    def __init__(
        self,
        stepper: Stepper,
        *,
        max_running: int,
        max_queue: int,
        observer: GenerationObserver | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.stepper = stepper
        self.max_running = max_running
        self.max_queue = max_queue
        self._observer: GenerationObserver = observer or NoGenerationObserver()
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: deque[Ticket] = deque()
        self._running: list[Ticket] = []
        self._stopping = False
        self._forecast = Forecast(max_running)
        self.fault: str | None = None
        self.recycle: str | None = None  # the watchdog's; a decoder never asks for one
        # The step in progress, for the watchdog: since when, and the latest its
        # generations may end (0.0: none in progress).
        self._step_since = 0.0
        self._step_due = 0.0
        # What a request waits on (the gevent runtime's signals, under that worker).
        self.new_signal: Callable[[], Signal] = ThreadSignal
        self._thread = threading.Thread(target=self._run, name="serving-decoder", daemon=True)

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Refuse new generations, let the running and waiting ones finish; False if
        they did not within ``timeout_s``."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.fault is None

    def describe(self) -> dict[str, Any]:
        return {
            "generation": "continuous" if self.stepper.batched else "interleaved",
            "max_running": self.max_running,
            "running": len(self._running),
            "waiting": len(self._waiting),
            "step_s": round(self._forecast.step_s, 6),
        }

    # -- requests -----------------------------------------------------------

    def admit(self, deadline: float) -> None:
        """Raise now what ``open`` would raise for a request whose first chunk is due by
        ``deadline``; queues nothing."""
        with self._cond:
            self._refuse(deadline, self._clock())

    def open(
        self, item: Any, ctx: Context, *, max_tokens: int, arrival: float, ends_by: float
    ) -> Ticket:
        """Queue a generation to join at the next step; its events come on the ticket."""
        generation = Generation(item, ctx, max_tokens)
        ticket = Ticket(
            generation,
            arrival=arrival,
            ends_by=ends_by,
            signal=self.new_signal(),
            on_cancel=self._gone,
        )
        with self._cond:
            self._refuse(ctx.deadline, self._clock())
            self._waiting.append(ticket)
            self._cond.notify()
        return ticket

    def _refuse(self, deadline: float | None, now: float) -> None:
        if self._stopping:
            raise NotReady("this worker is shutting down; retry on another one")
        if self.fault is not None:
            raise NotReady(f"this worker's model is out of order ({self.fault}); retry later")
        if len(self._waiting) >= self.max_queue:
            self._observer.rejected("queue_full")
            raise Overloaded(
                f"{len(self._waiting)} generations are waiting to start (SERVING_MAX_QUEUE); "
                "retry after the Retry-After interval",
                reason="queue_full",
                retry_after_s=self._first_chunk_s(len(self._waiting) + 1),
            )
        predicted = self._first_chunk_s(len(self._waiting) + 1)
        if deadline is not None and now + predicted > deadline:
            self._observer.rejected("predicted_late")
            raise Overloaded(
                f"the first token is predicted in {predicted:.3f} s, past this request's "
                "deadline; retry later or ask for a longer timeout",
                reason="predicted_late",
                retry_after_s=predicted,
            )

    def stalled(self, now: float, margin_s: float) -> str | None:
        """Why the decoder can no longer serve this worker, or None: its thread died, or
        a step has run ``margin_s`` past the latest end of its generations."""
        if self.fault is not None:
            return self.fault
        thread = self._thread
        if not thread.is_alive():
            if self._stopping or not thread.ident:
                return None  # stopped on purpose, or never started
            return "the decoder's thread has died"
        since = self._step_since
        if since and now > self._step_due + margin_s:
            return f"a step has run {now - since:.1f} s, past every deadline of its generations"
        return None

    def abandon(self, reason: str) -> None:
        """Give up on the decoder: refuse new generations and fail every running and
        waiting one now (503: another worker can serve them)."""
        with self._cond:
            self.fault = reason
            self._stopping = True
            dropped = [*self._running, *self._waiting]
            self._running = []
            self._waiting.clear()
            self._cond.notify_all()
        for ticket in dropped:
            ticket.done = True
            ticket.put(
                NotReady(
                    "this worker's model stopped answering and the worker is being replaced; retry"
                )
            )

    def _first_chunk_s(self, place: int) -> float:
        return self._forecast.first_chunk_s(place, len(self._running))

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except BaseException as exc:  # the thread must not die silently: fail them all
            log.exception("the decoder's thread failed")
            self.fault = f"the decoder failed: {exc!r}"
            with self._cond:
                left = [*self._running, *self._waiting]
                self._running.clear()
                self._waiting.clear()
            for ticket in left:
                ticket.put(NotReady(f"{self.fault}; retry on another worker"))

    def _turn(self) -> bool:
        """One step, with the joins and leaves before it; False when stopped and empty."""
        with self._cond:
            while not self._waiting and not self._running:
                if self._stopping:
                    return False
                self._cond.wait()
            now = self._clock()
            self._join(now)
        # Only this thread changes the running list; admission reads its length.
        self._leave(now)
        running = self._running
        if not running:
            return True
        observer = self._observer
        observer.active(len(running), len(self._waiting))
        started = self._clock()
        self._step_due = max(t.ends_by for t in running)
        self._step_since = started
        answers = self.stepper.step([t.generation for t in running])
        self._step_since = 0.0
        if self.fault is not None:
            return False  # given up (``abandon``) while the step ran: its requests are failed
        now = self._clock()
        took = now - started
        self._forecast.stepped(took)
        observer.step(len(running), took)
        self._settle(running, answers, now)
        return True

    def _settle(self, running: list[Ticket], answers: list[Answer], now: float) -> None:
        """Each answer's events to its ticket; the generations that ended leave."""
        done: list[Ticket] = []
        firsts: list[float] = []
        gaps: list[float] = []
        for ticket, answer in zip(running, answers, strict=True):
            last_event = answer[-1] if answer else None
            if ends(answer):
                ticket.done = True  # before its last event: a request that reads it lets go
                done.append(ticket)
            for event in answer:
                if isinstance(event, Chunk):
                    last = ticket.last_chunk_at
                    if last is None:
                        firsts.append(now - ticket.arrival)
                    else:
                        gaps.append(now - last)
                    ticket.last_chunk_at = now
                ticket.put(event)
            if isinstance(last_event, End):
                self._ended(ticket, now, last_event.reason)
            elif isinstance(last_event, ServingError):
                self._ended(ticket, now, "error")
        if firsts or gaps:
            self._observer.chunks(firsts, gaps)
        if done:
            self._running = [t for t in running if t not in done]

    def _join(self, now: float) -> None:
        """Under the lock: the gone and the late leave the queue; then those that fit join."""
        waiting = self._waiting
        for ticket in [t for t in waiting if t.cancelled or _late(t, now)]:
            waiting.remove(ticket)
            if ticket.cancelled:
                continue
            ticket.done = True
            ticket.put(
                DeadlineExceeded(
                    "the generation could not start within the request's deadline; retry "
                    "later or ask for a longer timeout"
                )
            )
            self._observer.ended("deadline")
        while waiting and len(self._running) < self.max_running:
            ticket = waiting.popleft()
            ticket.joined_at = now
            self._running.append(ticket)

    def _leave(self, now: float) -> None:
        """The running ones whose client hung up or whose time ran out leave now."""
        kept: list[Ticket] = []
        for ticket in self._running:
            if ticket.cancelled:
                self._ended(ticket, now, None)
            elif ticket.ends_by <= now:
                ticket.done = True
                ticket.put(
                    DeadlineExceeded(
                        "the generation ran past SERVING_GENERATION_TIMEOUT_S; ask for fewer "
                        "tokens (max_tokens) or raise the setting"
                    )
                )
                self._ended(ticket, now, "deadline")
            else:
                kept.append(ticket)
        if len(kept) != len(self._running):
            self._running = kept

    def _gone(self) -> None:
        # Counted when the request lets go, not when the next step drops it.
        self._observer.ended("gone")

    def _ended(self, ticket: Ticket, now: float, reason: str | None) -> None:
        if reason is not None:
            self._observer.ended(reason)
        if ticket.joined_at is not None:
            self._forecast.held(now - ticket.joined_at)


def _late(ticket: Ticket, now: float) -> bool:
    deadline = ticket.generation.context.deadline
    return deadline is not None and deadline <= now
