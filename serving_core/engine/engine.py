"""The handler run over items: validate → preprocess → a batched model call → postprocess.

Every way of serving goes through one ``Engine``, and each item ends in a
result or a ``ServingError`` of its own:

- online (``service.Service``): ``prepare`` and ``finish`` run where the
  request runs; ``run`` runs on the worker's model thread, fed by the batcher,
  which adds admission and deadlines;
- in-process (``predict_many``): ``serving-core check`` and ``serving-core
  batch``, with no thread, queue or server.

The split is also the seam for one model process per GPU fed by every HTTP
worker: ``prepare``/``finish`` (validation, tokenising) stay in the workers,
``run`` moves to the model process, and prepared items and results cross a
pipe, so they only need to pickle. Imports no Flask and starts nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from serving_core import context, threads
from serving_core.context import Context
from serving_core.engine.stepper import Stepper, generate_all
from serving_core.errors import QUOTE_CHARS, InvalidParams, ModelError, ServingError, quote, shorten
from serving_core.generation import MAX_TOKENS, Generation
from serving_core.handler import (
    Handler,
    InvalidInput,
    Output,
    Params,
    call_batch,
    handler_name,
    is_batched,
    is_generating,
)
from serving_core.tracing.tracer import Attributes, tracer

log = logging.getLogger("serving_core.engine.engine")

Result = Output | ServingError
# A 400 names this many schema errors at most, each quoting a short part of the
# client's value: a body of a million bad items must not come back a million times.
MAX_FIELD_ERRORS = 20
MAX_MESSAGE_CHARS = 200


@dataclass(frozen=True)
class Ran:
    """What one ``Engine.run`` produced: a result per item, and how many handler calls
    it took (1, unless an ``InvalidInput`` made it re-run the batch in halves)."""

    results: list[Result]
    calls: int
    # The batch's ``model`` span as a ``traceparent``, for each item's ``queue`` span to
    # link back to; None with traces off.
    span: str | None = None


class Engine:
    def __init__(
        self,
        handler: Handler,
        *,
        max_batch_size: int,
        max_tokens: int = 256,
        on_failure: Callable[[int], None] | None = None,
    ) -> None:
        self.handler = handler
        self.name = handler_name(handler)
        self.version = handler.version
        self.batched = is_batched(type(handler))
        # A generating handler's steps (``serving_core.generation``); None: one-shot.
        self.stepper = Stepper(handler) if is_generating(type(handler)) else None
        # Unbatched handlers run one item at a time: fast tokenizers and many
        # models are not thread-safe, and predict(item) takes one. Generations
        # run SERVING_MAX_BATCH_SIZE at a time in either form: one thread steps them.
        self.max_batch_size = max_batch_size if self.batched or self.stepper else 1
        self.max_tokens = max_tokens
        schema = handler.input_schema
        self._validator = (
            None if schema is None else jsonschema.validators.validator_for(schema)(schema)
        )
        self._on_failure = on_failure

    # -- where the request runs --------------------------------------------

    def validate(self, params: Params) -> None:
        """Raise ``InvalidParams`` naming every field that breaks the input schema."""
        if self._validator is None:
            return
        errors = sorted(self._validator.iter_errors(params), key=lambda e: list(e.path))
        if errors:
            fields = [
                {"field": shorten(_field(e), QUOTE_CHARS), "message": _message(e)}
                for e in errors[:MAX_FIELD_ERRORS]
            ]
            message = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
            if len(errors) > MAX_FIELD_ERRORS:
                message += f"; and {len(errors) - MAX_FIELD_ERRORS} more"
            raise InvalidParams(message, details=fields)

    def prepare(self, params: Params, ctx: Context) -> Any:
        """Validate and preprocess one request: what ``run`` receives for it."""
        self.validate(params)
        # context.serving's token by hand: a context manager costs more than the hook.
        token = context.enter(ctx)
        try:
            # Under the item's own span: a job's, a message's or a chunk's, where no
            # request span is current (in HTTP it is the same span).
            with tracer().span("preprocess", parent=ctx.traceparent):
                return self.handler.preprocess(params)
        except InvalidInput as exc:
            raise InvalidParams(str(exc)) from exc
        finally:
            context.leave(token)

    def token_limit(self, params: Params) -> int:
        """The request's ``max_tokens``, checked against SERVING_MAX_TOKENS (its default)."""
        asked = params.get(MAX_TOKENS)
        if asked is None:
            return self.max_tokens
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
            raise InvalidParams(f"{MAX_TOKENS} must be a whole number of at least 1; send e.g. 64")
        if asked > self.max_tokens:
            raise InvalidParams(
                f"{MAX_TOKENS} {asked} is more than this server generates for one request "
                f"({self.max_tokens}, SERVING_MAX_TOKENS); ask for at most that"
            )
        return asked

    def collect(self, chunks: list[Output], ctx: Context) -> Output:
        """A generation's one answer from its chunks (``Handler.collect``)."""
        token = context.enter(ctx)
        try:
            return self.handler.collect(chunks)
        finally:
            context.leave(token)

    def finish(self, output: Output, params: Params, ctx: Context) -> Output:
        """Postprocess one model output into the answer."""
        token = context.enter(ctx)
        try:
            with tracer().span("postprocess", parent=ctx.traceparent):
                return self.handler.postprocess(output, params)
        except InvalidInput as exc:
            raise InvalidParams(str(exc)) from exc
        finally:
            context.leave(token)

    # -- the model call -----------------------------------------------------

    def run(self, items: Sequence[Any], contexts: Sequence[Context]) -> Ran:
        """The handler on up to ``max_batch_size`` prepared items: a result per item.

        An ``InvalidInput`` raised by the handler fails only its item: the batch
        is re-run in halves to find it. Any other exception fails this batch's
        items with ``ModelError`` (logged once, with their request ids).
        """
        calls = [0]
        # One span for the batch, linked to every request that rode in it (``batch_span``);
        # busy while it runs, and on the idle peers' cores too (``threads.held``).
        attributes: Attributes = {"serving.batch_size": len(items), "serving.model.name": self.name}
        members = (c.traceparent for c in contexts)
        with tracer().batch_span("model", members, attributes) as span, threads.held():
            results = self._call(list(items), list(contexts), calls)
            span.set("serving.handler_calls", calls[0])
        return Ran(results, calls[0], span.traceparent)

    def _call(self, items: list[Any], contexts: list[Context], calls: list[int]) -> list[Result]:
        calls[0] += 1
        try:
            with context.serving_batch(contexts):
                outputs = call_batch(self.handler, items)
        except InvalidInput as exc:
            if len(items) == 1:
                return [InvalidParams(str(exc))]
            middle = len(items) // 2
            return self._call(items[:middle], contexts[:middle], calls) + self._call(
                items[middle:], contexts[middle:], calls
            )
        except ServingError as exc:
            # The handler chose the answer (a pipeline's 502 naming its stage).
            return [exc for _ in contexts]
        except Exception:
            ids = ", ".join(c.request_id for c in contexts)
            log.exception("the handler failed on a batch of %d (request ids: %s)", len(items), ids)
            if self._on_failure is not None:
                self._on_failure(len(items))
            return [
                ModelError(
                    "the model failed on this request; "
                    f"the server log has the details under request id {c.request_id}"
                )
                for c in contexts
            ]
        return [
            InvalidParams(str(output)) if isinstance(output, InvalidInput) else output
            for output in outputs
        ]

    # -- in-process: check, batch, queue workers ----------------------------

    def predict_many(
        self, params: Sequence[Params], contexts: Sequence[Context] | None = None
    ) -> list[Result]:
        """Every step for each of ``params``, the model in batches of ``max_batch_size``;
        one result per input, in order. Nothing raised for a bad item: it is its result."""
        if contexts is None:
            contexts = [Context(f"item-{i}") for i in range(len(params))]
        results: list[Result | None] = [None] * len(params)
        ready: list[tuple[int, Any]] = []
        for i, (one, ctx) in enumerate(zip(params, contexts, strict=True)):
            try:
                ready.append((i, self.prepare(one, ctx)))
            except Exception as exc:
                results[i] = self._item_error(exc, ctx, "preprocess")
        # Generations go in one pass over them all: one joins as another leaves.
        size = max(1, len(ready)) if self.stepper is not None else self.max_batch_size
        for start in range(0, len(ready), size):
            chunk = ready[start : start + size]
            ran = self._run_chunk(chunk, params, contexts)
            for (i, _), result in zip(chunk, ran, strict=True):
                if isinstance(result, ServingError):
                    results[i] = result
                    continue
                try:
                    results[i] = self.finish(result, params[i], contexts[i])
                except Exception as exc:
                    results[i] = self._item_error(exc, contexts[i], "postprocess")
        done = [result for result in results if result is not None]
        if len(done) != len(params):
            raise AssertionError("predict_many left an item without a result")
        return done

    def _run_chunk(
        self, chunk: list[tuple[int, Any]], params: Sequence[Params], contexts: Sequence[Context]
    ) -> list[Result]:
        if self.stepper is None:
            return self.run([item for _, item in chunk], [contexts[i] for i, _ in chunk]).results
        generations: list[Generation] = []
        refused: dict[int, ServingError] = {}
        for i, item in chunk:
            try:
                generations.append(Generation(item, contexts[i], self.token_limit(params[i])))
            except ServingError as exc:
                refused[i] = exc
        ran = iter(generate_all(self.stepper, generations, self.max_batch_size))
        results: list[Result] = []
        for i, _ in chunk:
            if i in refused:
                results.append(refused[i])
                continue
            one = next(ran)
            results.append(one if isinstance(one, ServingError) else self.collect(one, contexts[i]))
        return results

    def _item_error(self, exc: Exception, ctx: Context, hook: str) -> ServingError:
        # A bug in one item's pre/postprocess fails that item, not the whole run
        # (online, the same exception is the request's 500 through the app's funnel).
        if isinstance(exc, ServingError):
            return exc
        log.error("%s failed for request %s", hook, ctx.request_id, exc_info=exc)
        return ModelError(
            f"{hook} failed on this item; the log has the details under id {ctx.request_id}"
        )


# The keywords whose jsonschema message leaves out the limit it broke.
UNSTATED_LIMITS = frozenset(
    {"maxLength", "minLength", "maxItems", "minItems", "maxProperties", "minProperties"}
)


def _field(error: jsonschema.ValidationError) -> str:
    return "/".join(str(p) for p in error.path) or "(root)"


def _message(error: jsonschema.ValidationError) -> str:
    """jsonschema's message with the client's value, which it quotes whole, cut short."""
    message = error.message
    whole = repr(error.instance)
    if len(whole) > QUOTE_CHARS:
        message = message.replace(whole, quote(error.instance))
    # Other parts may quote the client too (an unexpected property's name).
    message = shorten(message, MAX_MESSAGE_CHARS)
    if error.validator in UNSTATED_LIMITS:
        # jsonschema says "is too long" without the limit; the client needs it to fix the call.
        message += f" ({error.validator} {error.validator_value})"
    return message
