"""A pipeline of services: a handler whose stages are other services, called over HTTP.

A ``Pipeline`` is a ``Handler`` (``concurrent = True``): it is served like any
other (gunicorn, nginx, metrics, the chart), but ``predict`` runs where the
request runs, so a request waiting on its stages never queues behind a model
thread. ``serial`` stages run in order, each output merged into the next
stage's input (or put under the stage's ``into`` key); ``parallel`` stages run
at once (greenlets under the gevent worker, a small thread pool under gthread)
and are aggregated as ``all`` or ``best_label``. The file format is in
``pipelineconfig``.

Each call forwards ``X-Request-ID`` and what is left of the deadline as
``X-Request-Timeout``; its timeout is the stage's ``timeout_s`` capped by that
remainder. Only connection failures are retried (the request never reached
the stage); a timeout or an error status is not. An optional stage that fails
is skipped and reported; a required one fails the request: 502 naming it
(504 when the request's own deadline ran out, 400 when the stage refused the
input). Every answer lists the stages: ran or skipped, why, and how long.

Connections: one ``urllib3.PoolManager`` per worker, made in ``setup_worker``
(after fork: a socket must not be shared by two processes), keeping up to
``pool_size`` connections open per stage. urllib3 rather than ``requests``:
it is the pool ``requests`` wraps, with no dependencies, it takes a total
timeout per call, and retries can be switched off so that only connection
failures are retried, here, within the budget. Under the gevent worker its
sockets are gevent's, so a waiting call yields to the worker's other requests.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ProtocolError

from serving_core import context, encoding
from serving_core.context import Context
from serving_core.errors import BadGateway, DeadlineExceeded, InvalidParams
from serving_core.handler import Handler, Output, Params
from serving_core.pipeline.config import PipelineError, PipelineSpec, StageSpec, read
from serving_core.runtime import THREADS, Runtime

log = logging.getLogger("serving_core.pipeline.core")

READINESS_TTL_S = 2.0  # how long a stages' readiness answer is reused
READINESS_TIMEOUT_S = 0.5
_BACKOFF_S = 0.02  # before the first retry of a refused connection; doubled each time


@dataclass(frozen=True)
class Failure:
    kind: str  # timeout, unavailable, rejected (400), status, invalid_response
    message: str
    deadline: bool = False  # the request's own deadline, not the stage's timeout, ran out

    def body(self) -> dict[str, str]:
        return {"type": self.kind, "message": self.message}


@dataclass(frozen=True)
class Outcome:
    stage: StageSpec
    output: Output | None
    failure: Failure | None
    elapsed_s: float
    attempts: int

    def report(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "stage": self.stage.name,
            "status": "ran" if self.failure is None else "skipped",
            "elapsed_ms": round(self.elapsed_s * 1000, 2),
        }
        if self.attempts > 1:
            entry["attempts"] = self.attempts
        if self.failure is not None:
            if not self.stage.optional:
                entry["status"] = "failed"
            entry["reason"] = self.failure.body()
        return entry


class Pipeline(Handler):
    """The stages of ``spec`` as one handler; made by ``load`` (one subclass per file)."""

    concurrent = True
    # Stages cache their own answers; a pipeline's answer may be degraded (an
    # optional stage skipped), which must not be served again from a cache.
    cacheable = False
    spec: PipelineSpec

    def __init__(self) -> None:
        self.runtime = THREADS
        self._http: urllib3.PoolManager | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._ready_at = -float("inf")
        self._ready = False
        self._ready_lock = threading.Lock()

    def setup(self) -> None:
        unset = self.spec.unset()
        if unset:
            raise PipelineError(
                f"{self.spec.source}: the stage variable(s) {', '.join(unset)} are not set; "
                "set each url_env to its service's base URL, e.g. http://iris-setosa:8000, "
                "and each key_env to an API key that service accepts"
            )

    def setup_worker(self) -> None:
        self._http = urllib3.PoolManager(
            num_pools=len(self.spec.stages) + 1,
            maxsize=self.spec.pool_size,
            block=False,
            retries=False,
        )
        if self.spec.kind == "parallel":
            # Used only where sockets are not gevent's (gthread): a request thread
            # hands its stage calls to these threads.
            self._threads = ThreadPoolExecutor(
                max_workers=self.spec.pool_size, thread_name_prefix="pipeline-stage"
            )

    def ready(self) -> bool:
        if not self.spec.readiness:
            return True
        now = time.monotonic()
        if now - self._ready_at < READINESS_TTL_S:
            return self._ready
        with self._ready_lock:
            if time.monotonic() - self._ready_at >= READINESS_TTL_S:
                self._ready = all(
                    self._stage_ready(stage) for stage in self.spec.stages if not stage.optional
                )
                self._ready_at = time.monotonic()
        return self._ready

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
        failure = Failure(
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

    # -- one call -----------------------------------------------------------

    def _call(self, stage: StageSpec, params: Params, ctx: Context) -> Outcome:
        started = time.monotonic()
        budget = stage.timeout_s
        remaining = ctx.remaining_s()
        capped = remaining is not None and remaining < budget
        if remaining is not None:
            budget = min(budget, remaining)
        until = started + budget
        body = encoding.dumps(params)
        attempts = 0
        failure: Failure | None = None
        output: Output | None = None
        while True:
            attempts += 1
            left = until - time.monotonic()
            if left <= 0:
                failure = Failure("timeout", f"no answer within {budget:.3f} s", capped)
                break
            try:
                output, failure = self._post(stage, body, ctx.request_id, left)
            except (NewConnectionError, ProtocolError) as exc:
                # The request did not reach the stage (refused, reset before an
                # answer): safe to send again while the budget lasts.
                failure = Failure("unavailable", _reason(exc))
                if attempts <= stage.retries:
                    time.sleep(min(_BACKOFF_S * 2 ** (attempts - 1), max(0.0, left / 2)))
                    continue
            except (ConnectTimeoutError, urllib3.exceptions.TimeoutError):
                failure = Failure("timeout", f"no answer within {budget:.3f} s", capped)
            except HTTPError as exc:
                failure = Failure("unavailable", _reason(exc))
            break
        elapsed = time.monotonic() - started
        if failure is not None:
            log.warning(
                "request %s: stage %s %s after %.3f s (%d attempt%s): %s",
                ctx.request_id,
                stage.name,
                "skipped" if stage.optional else "failed",
                elapsed,
                attempts,
                "" if attempts == 1 else "s",
                failure.message,
            )
        return Outcome(stage, output, failure, elapsed, attempts)

    def _post(
        self, stage: StageSpec, body: bytes, request_id: str, left: float
    ) -> tuple[Output | None, Failure | None]:
        if self._http is None:
            raise RuntimeError("Pipeline.setup_worker() has not run in this process")
        headers = {
            "Content-Type": "application/json",
            "X-Request-ID": request_id,
            "X-Request-Timeout": f"{left:.3f}",
        }
        if stage.api_key is not None:
            headers["Authorization"] = f"Bearer {stage.api_key}"
        response = self._http.request(
            "POST",
            stage.endpoint,
            body=body,
            headers=headers,
            timeout=urllib3.Timeout(total=left),
            retries=False,
        )
        try:
            answer = orjson.loads(response.data)
        except orjson.JSONDecodeError:
            answer = None
        if response.status == 200:
            if isinstance(answer, dict):
                return answer, None
            return None, Failure("invalid_response", "its answer is not a JSON object")
        message = f"HTTP {response.status}"
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            message += f" {answer['error'].get('type')}: {answer['error'].get('message')}"
        return None, Failure("rejected" if response.status == 400 else "status", message)

    def _stage_ready(self, stage: StageSpec) -> bool:
        if self._http is None or stage.url is None:
            return False
        try:
            response = self._http.request(
                "GET",
                stage.url.rstrip("/") + "/readyz",
                timeout=urllib3.Timeout(total=READINESS_TIMEOUT_S),
                retries=False,
            )
        except HTTPError:
            return False
        return response.status == 200


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None) or exc
    return f"connection failed: {reason}"


def load(path: Path, environ: Mapping[str, str], runtime: Runtime = THREADS) -> Pipeline:
    """A ``Pipeline`` for the file at ``path``, stage URLs looked up in ``environ``;
    its stage calls wait as ``runtime`` says (greenlets in a gevent worker)."""
    spec = read(path, environ)
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
