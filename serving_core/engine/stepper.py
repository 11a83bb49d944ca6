"""One step of a generating handler over its running generations, each answer checked.

``Stepper.step`` calls the handler's ``step`` (the batched form) or advances
each generation's own generator by one chunk (the simple form), and turns
every answer into a ``Chunk``, ``None`` (nothing this step), an ``End`` or a
``ServingError`` of that generation's own. The scheduling (who joins, who
leaves) is the caller's: ``decoder.Decoder`` online, ``generate_all`` in
process. Imports no Flask and starts nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from serving_core import context, threads
from serving_core.errors import InvalidParams, ModelError, ServingError
from serving_core.generation import Final, Generation
from serving_core.handler import Handler, InvalidInput, Output, steps_together

log = logging.getLogger("serving_core.engine.stepper")


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk the handler produced for a generation."""

    output: Output


@dataclass(frozen=True, slots=True)
class End:
    """A generation's end: ``stop`` (the handler ended it) or ``length`` (its token limit)."""

    reason: str


Event = Chunk | End | ServingError
# What one step answers for one generation: its events, in order (none: nothing yet).
Answer = tuple[Event, ...]
NOTHING: Answer = ()
STOP = End("stop")
LENGTH = End("length")


class Stepper:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.batched = steps_together(type(handler))
        self._where = f"{type(handler).__name__}.{'step' if self.batched else 'generate'}"

    def step(self, generations: list[Generation]) -> list[Answer]:
        """One step of every generation in ``generations``: an answer each, in order.
        Counts each chunk in ``Generation.tokens`` and ends one at its limit."""
        with threads.held(), context.serving_batch([g.context for g in generations]):
            if self.batched:
                raw = self._step_together(generations)
            else:
                raw = [self._advance(g) for g in generations]
        answers = [_answer(g, one) for g, one in zip(generations, raw, strict=True)]
        for generation in generations:
            generation.steps += 1
        return answers

    def _step_together(self, generations: list[Generation]) -> list[Any]:
        try:
            answers = self.handler.step(generations)
            if not isinstance(answers, list | tuple):
                raise TypeError(
                    f"{self._where} returned {type(answers).__name__}; return a list with "
                    "one answer per generation"
                )
            if len(answers) != len(generations):
                raise TypeError(
                    f"{self._where} returned {len(answers)} answers for {len(generations)} "
                    "generations; return exactly one per generation, in the same order"
                )
            return list(answers)
        except InvalidInput as exc:
            # Raised, not returned in a slot: the handler did not say whose it was.
            return [InvalidParams(str(exc)) for _ in generations]
        except ServingError as exc:
            return [exc for _ in generations]
        except Exception:
            ids = ", ".join(g.context.request_id for g in generations)
            log.exception(
                "the handler failed on a step of %d generations (request ids: %s)",
                len(generations),
                ids,
            )
            return [_model_error(g) for g in generations]

    def _advance(self, generation: Generation) -> Any:
        try:
            if generation.iterator is None:
                generation.iterator = iter(self.handler.generate(generation.item))
            return next(generation.iterator)
        except StopIteration:
            return Final()
        except InvalidInput as exc:
            return InvalidParams(str(exc))
        except ServingError as exc:
            return exc
        except Exception:
            log.exception(
                "the handler's generate failed (request id %s)", generation.context.request_id
            )
            return _model_error(generation)


def _answer(generation: Generation, raw: Any) -> Answer:
    if isinstance(raw, ServingError):
        return (raw,)
    if isinstance(raw, InvalidInput):
        return (InvalidParams(str(raw)),)
    if raw is None:
        return NOTHING
    final = isinstance(raw, Final)
    chunk = raw.chunk if isinstance(raw, Final) else raw
    if chunk is not None and not isinstance(chunk, dict):
        log.error(
            "a generating handler answered a %s for request %s; answer a dict (a chunk), "
            "None, Final(chunk) or InvalidInput",
            type(chunk).__name__,
            generation.context.request_id,
        )
        return (_model_error(generation),)
    events: list[Event] = []
    if chunk is not None:
        generation.tokens += 1
        events.append(Chunk(chunk))
    if final:
        events.append(STOP)
    elif generation.tokens >= generation.max_tokens:
        events.append(LENGTH)
    return tuple(events)


def _model_error(generation: Generation) -> ModelError:
    return ModelError(
        "the model failed on this request; the server log has the details under request id "
        f"{generation.context.request_id}"
    )


def collect(events: Iterable[Event]) -> tuple[list[Output], str]:
    """One generation's chunks and why it ended (``End.reason``); raises its error."""
    chunks: list[Output] = []
    for event in events:
        if isinstance(event, Chunk):
            chunks.append(event.output)
        elif isinstance(event, End):
            return chunks, event.reason
        else:
            raise event
    raise RuntimeError("a generation's events ended with neither an end nor an error")


def ends(answer: Sequence[Event]) -> bool:
    """Whether this answer is the generation's last."""
    return bool(answer) and not isinstance(answer[-1], Chunk)


def generate_all(
    stepper: Stepper, generations: Sequence[Generation], max_running: int
) -> list[list[Output] | ServingError]:
    """Every generation to its end, in this thread, ``max_running`` at a time with
    continuous batching (one joins as one leaves): each one's chunks, or its error.
    The in-process paths' (jobs, batch runs, the stream worker, ``check``)."""
    chunks: list[list[Output]] = [[] for _ in generations]
    results: list[list[Output] | ServingError | None] = [None] * len(generations)
    waiting = list(range(len(generations)))
    waiting.reverse()
    running: list[int] = []
    while waiting or running:
        while waiting and len(running) < max_running:
            running.append(waiting.pop())
        answers = stepper.step([generations[i] for i in running])
        kept: list[int] = []
        for i, answer in zip(running, answers, strict=True):
            for event in answer:
                if isinstance(event, Chunk):
                    chunks[i].append(event.output)
                elif isinstance(event, ServingError):
                    results[i] = event
                else:
                    results[i] = chunks[i]
            if not ends(answer):
                kept.append(i)
        running = kept
    return [result if result is not None else chunks[i] for i, result in enumerate(results)]
