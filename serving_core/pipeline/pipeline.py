"""A pipeline of services: a handler whose stages are other services, over HTTP or gRPC.

A ``Pipeline`` is a ``Handler`` (``concurrent = True``): it is served like any
other (gunicorn, nginx, metrics, the chart), but ``predict`` runs where the
request runs, so a request waiting on its stages never queues behind a model
thread. ``serial`` stages run in order, each output merged into the next
stage's input (or put under the stage's ``into`` key); ``parallel`` stages run
at once (greenlets under the gevent worker, a small thread pool under gthread)
and are aggregated as ``all`` or ``best_label``. The file format is in
``config``.

Each stage is called through the worker's ``StageClient`` (``client``), with
the request's id and what is left of its deadline. An optional stage that
fails is skipped and reported; a required one fails the request: 502 naming
it (504 when the request's own deadline ran out, 400 when the stage refused
the input). Every answer lists the stages: ran or skipped, why, and how long.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from serving_core import context
from serving_core.context import Context
from serving_core.errors import BadGateway, DeadlineExceeded, InvalidParams
from serving_core.handler import Handler, Output, Params
from serving_core.pipeline import transport
from serving_core.pipeline.client import Outcome, StageClient, StageFailure
from serving_core.pipeline.config import PipelineError, PipelineSpec, StageSpec, read
from serving_core.runtime import THREADS, Runtime


class Pipeline(Handler):
    """The stages of ``spec`` as one handler; made by ``load`` (one subclass per file)."""

    concurrent = True
    # Stages cache their own answers; a pipeline's answer may be degraded (an
    # optional stage skipped), which must not be served again from a cache.
    cacheable = False
    spec: PipelineSpec

    def __init__(self) -> None:
        self.runtime = THREADS
        self._client: StageClient | None = None
        self._threads: ThreadPoolExecutor | None = None

    def setup(self) -> None:
        unset = self.spec.unset()
        if unset:
            raise PipelineError(
                f"{self.spec.source}: the stage variable(s) {', '.join(unset)} are not set; "
                "set each url_env to its service's base URL, e.g. http://iris-setosa:8000, "
                "each grpc_env to its gRPC host:port, e.g. minilm-ids:8001, "
                "and each key_env to an API key that service accepts"
            )

    def check_callers(self, *, keys: bool, allowed: bool) -> None:
        """Refuse to serve as an open relay: stages that need keys, which this
        pipeline sends them, reached by anyone because it asks none of its callers.
        ``keys``: whether this service has API keys; ``allowed``: the setting that
        permits it anyway (a gateway in front checks the callers)."""
        forwarded = [stage.key_env for stage in self.spec.stages if stage.key_env]
        if forwarded and not keys and not allowed:
            raise PipelineError(
                f"{self.spec.source}: the stages get API keys ({', '.join(forwarded)}) but "
                "this pipeline asks its callers for none, so anyone could reach them "
                "through it; set SERVING_API_KEYS or SERVING_API_KEYS_FILE, or "
                "SERVING_PIPELINE_WITHOUT_KEYS=true when a gateway in front checks callers"
            )

    def setup_worker(self) -> None:
        self._client = StageClient(self.spec.stages, self.spec.pool_size, self.runtime)
        if self.spec.kind == "parallel":
            # Used only where sockets are not gevent's (gthread): a request thread
            # hands its stage calls to these threads.
            self._threads = ThreadPoolExecutor(
                max_workers=self.spec.pool_size, thread_name_prefix="pipeline-stage"
            )

    def ready(self) -> bool:
        if not self.spec.readiness:
            return True
        required = [stage for stage in self.spec.stages if not stage.optional]
        return self._client is not None and self._client.ready(required)

    def predict(self, item: Params) -> Output:
        contexts = context.batch()
        ctx = contexts[0] if contexts else Context("-")
        if self.spec.kind == "serial":
            return self._serial(item, ctx)
        return self._parallel(item, ctx)

    # -- composition --------------------------------------------------------

    def _serial(self, params: Params, ctx: Context) -> Output:
        state = dict(params)
        last: Output | None = None
        outcomes: list[Outcome] = []
        for stage in self.spec.stages:
            outcome = self._call(stage, state, ctx)
            outcomes.append(outcome)
            if outcome.failure is not None:
                self._check_required(outcome, outcomes)
                continue
            assert outcome.output is not None
            last = outcome.output
            state = {**state, stage.into: last} if stage.into else {**state, **last}
        if last is None:
            raise BadGateway(
                "every stage was skipped; none answered",
                details={"stages": [o.report() for o in outcomes]},
            )
        return {**last, "stages": [o.report() for o in outcomes]}

    def _parallel(self, params: Params, ctx: Context) -> Output:
        outcomes = [self._scored(o) for o in self._fan_out(params, ctx)]
        for outcome in outcomes:
            if outcome.failure is not None:
                self._check_required(outcome, outcomes)
        results = {
            o.stage.name: o.output if o.failure is None else {"error": o.failure.body()}
            for o in outcomes
        }
        report = [o.report() for o in outcomes]
        if self.spec.aggregate == "all":
            return {"results": results, "stages": report}
        field = self.spec.score_field
        scores = {o.stage.label: o.output[field] for o in outcomes if o.output is not None}
        if not scores:
            raise BadGateway("no stage answered", details={"stages": report})
        label = max(scores, key=lambda name: scores[name])
        return {
            "label": label,
            field: scores[label],
            "scores": scores,
            "results": results,
            "stages": report,
        }

    def _fan_out(self, params: Params, ctx: Context) -> list[Outcome]:
        stages = self.spec.stages
        if self.runtime.green:
            # A greenlet per stage on this worker's hub; the request's greenlet waits
            # on futures that yield to the hub (a native wait would stall the worker).
            futures = [self.runtime.new_future() for _ in stages]
            for stage, future in zip(stages, futures, strict=True):
                self.runtime.spawn(functools.partial(self._settle, future, stage, params, ctx))
            return [future.result() for future in futures]
        if self._threads is None:
            return [self._call(stage, params, ctx) for stage in stages]
        futures = [self._threads.submit(self._call, stage, params, ctx) for stage in stages]
        return [future.result() for future in futures]

    def _settle(self, future: Future[Any], stage: StageSpec, params: Params, ctx: Context) -> None:
        try:
            future.set_result(self._call(stage, params, ctx))
        except BaseException as exc:  # the request's greenlet re-raises it
            future.set_exception(exc)

    def _scored(self, outcome: Outcome) -> Outcome:
        """best_label: an answer without a numeric score is a stage failure too."""
        if self.spec.aggregate != "best_label" or outcome.output is None:
            return outcome
        score = outcome.output.get(self.spec.score_field)
        if isinstance(score, int | float) and not isinstance(score, bool):
            return outcome
        failure = StageFailure(
            "invalid_response",
            f"its answer has no numeric {self.spec.score_field!r} to compare",
        )
        return Outcome(outcome.stage, None, failure, outcome.elapsed_s, outcome.attempts)

    def _check_required(self, outcome: Outcome, outcomes: list[Outcome]) -> None:
        failure, stage = outcome.failure, outcome.stage
        if failure is None or stage.optional:
            return
        message = f"stage {stage.name!r} failed: {failure.message}"
        details = {"stage": stage.name, "stages": [o.report() for o in outcomes]}
        if failure.kind == "rejected":
            raise InvalidParams(message, details=details)
        if failure.deadline:
            raise DeadlineExceeded(message + "; retry with a longer X-Request-Timeout")
        raise BadGateway(message, details=details)

    def _call(self, stage: StageSpec, params: Params, ctx: Context) -> Outcome:
        if self._client is None:
            raise RuntimeError("Pipeline.setup_worker() has not run in this process")
        return self._client.call(stage, params, ctx)


def load(path: Path, environ: Mapping[str, str], runtime: Runtime = THREADS) -> Pipeline:
    """A ``Pipeline`` for the file at ``path``, stage URLs looked up in ``environ``;
    its stage calls wait as ``runtime`` says (greenlets in a gevent worker)."""
    spec = read(path, environ)
    grpc_stages = [stage.name for stage in spec.stages if stage.protocol == "grpc"]
    if grpc_stages and runtime.green:
        # grpcio's calls wait natively: one would stall every request on the hub.
        raise PipelineError(
            f"{spec.source}: stage(s) {', '.join(grpc_stages)} speak gRPC, whose calls "
            "block a gevent worker; serve this pipeline with SERVING_WORKER_CLASS=gthread"
        )
    if grpc_stages:
        transport.require_grpc(spec.source)
    cls = type(
        "Pipeline",
        (Pipeline,),
        {
            "name": spec.name,
            "version": spec.version,
            "input_schema": spec.input_schema,
            "spec": spec,
            "__module__": __name__,
        },
    )
    pipeline: Pipeline = cls()
    pipeline.runtime = runtime
    return pipeline
