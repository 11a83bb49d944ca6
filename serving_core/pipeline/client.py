"""A worker's client for a pipeline's stages: one call with its retries, and readiness.

Each call forwards ``X-Request-ID`` and what is left of the deadline as
``X-Request-Timeout``; its timeout is the stage's ``timeout_s`` capped by that
remainder. Only connection failures are retried (the request never reached
the stage); a timeout or an error status is not. A call never raises for the
stage's sake: its ``Outcome`` says what came back, or how it failed.

Connections: one ``urllib3.PoolManager`` per worker, made after fork (a socket
must not be shared by two processes), keeping up to ``pool_size`` connections
open per stage. urllib3 rather than ``requests``: it is the pool ``requests``
wraps, with no dependencies, it takes a total timeout per call, and retries
can be switched off so that only connection failures are retried, here,
within the budget. Under the gevent worker its sockets are gevent's, so a
waiting call yields to the worker's other requests.

A ``grpc_env`` stage is called through the gRPC transport instead (V2
``ModelInfer`` with tensors; ``pipeline.transport``, which the command line fills
with ``serving_core.grpc.stage``): the same budget as its deadline, the same key
(as ``authorization`` metadata), retried on ``UNAVAILABLE`` and
``RESOURCE_EXHAUSTED``. A transport is made only when a stage speaks gRPC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ProtocolError

from serving_core import encoding
from serving_core.context import Context
from serving_core.handler import Output, Params
from serving_core.pipeline.config import StageSpec
from serving_core.pipeline.transport import GrpcTransport, StageError, grpc_transport
from serving_core.runtime import Runtime
from serving_core.tracing.traceparent import trace_id_of
from serving_core.tracing.tracer import tracer

log = logging.getLogger("serving_core.pipeline.client")

READINESS_TTL_S = 2.0  # how long a stages' readiness answer is reused
READINESS_TIMEOUT_S = 0.5
_BACKOFF_S = 0.02  # before the first retry of a refused connection; doubled each time
UNREACHABLE = "connection failed; the server's log names the address it tried"


@dataclass(frozen=True)
class StageFailure:
    kind: str  # timeout, unavailable, rejected (400), status, invalid_response
    message: str  # what the client reads: never the stage's address
    deadline: bool = False  # the request's own deadline, not the stage's timeout, ran out
    detail: str = ""  # for the server's log only: urllib3's words name the host and port

    def body(self) -> dict[str, str]:
        return {"type": self.kind, "message": self.message}


@dataclass(frozen=True)
class Outcome:
    """One stage's part in one request: its output, or why it has none."""

    stage: StageSpec
    output: Output | None
    failure: StageFailure | None
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


class StageClient:
    """Calls the stages of one pipeline from one worker, over a pool of connections."""

    def __init__(self, stages: Sequence[StageSpec], pool_size: int, runtime: Runtime) -> None:
        self._http = urllib3.PoolManager(
            num_pools=len(stages) + 1, maxsize=pool_size, block=False, retries=False
        )
        self._ready_at = -float("inf")
        self._ready = False
        # Held across the stages' /readyz calls, which yield to the hub under gevent:
        # a native lock there would hang the worker on a second probe meanwhile.
        self._ready_lock = runtime.new_lock()
        self._grpc: GrpcTransport | None = None
        if any(stage.protocol == "grpc" for stage in stages):
            self._grpc = grpc_transport()

    def call(self, stage: StageSpec, params: Params, ctx: Context) -> Outcome:
        """``params`` to ``stage``, again while its connection is refused and both its
        ``retries`` and the budget (its timeout, capped by the request's deadline) last."""
        traces = tracer()
        if not traces.enabled:
            return self._attempts(stage, params, ctx)
        # Under the batch's span where this thread has it (the request's own trace),
        # else under the request's: a parallel fan-out's thread has no current span.
        current = traces.current()
        same = current is not None and trace_id_of(current) == trace_id_of(ctx.traceparent)
        attributes = {"serving.stage": stage.name, "serving.stage.protocol": stage.protocol}
        with traces.span(
            f"stage {stage.name}",
            parent=current if same else ctx.traceparent,
            kind="client",
            attributes=attributes,
        ) as span:
            outcome = self._attempts(stage, params, ctx)
            span.set("serving.stage.attempts", outcome.attempts)
            if outcome.failure is not None:
                span.set("error.type", outcome.failure.kind)
                # A stage that did not answer is this call's failure, whatever it costs
                # the request (an optional stage is skipped).
                span.answered(400 if outcome.failure.kind == "rejected" else 502)
        return outcome

    def _attempts(self, stage: StageSpec, params: Params, ctx: Context) -> Outcome:
        started = time.monotonic()
        budget = stage.timeout_s
        remaining = ctx.remaining_s()
        capped = remaining is not None and remaining < budget
        if remaining is not None:
            budget = min(budget, remaining)
        until = started + budget
        body = encoding.dumps(params)
        attempts = 0
        failure: StageFailure | None = None
        output: Output | None = None
        while True:
            attempts += 1
            left = until - time.monotonic()
            if left <= 0:
                failure = StageFailure("timeout", f"no answer within {budget:.3f} s", capped)
                break
            if stage.protocol == "grpc":
                output, failure, again = self._infer(stage, params, ctx.request_id, until)
                if failure is not None and failure.kind == "timeout":
                    failure = StageFailure("timeout", f"no answer within {budget:.3f} s", capped)
                if again and attempts <= stage.retries:
                    time.sleep(min(_BACKOFF_S * 2 ** (attempts - 1), max(0.0, left / 2)))
                    continue
                break
            try:
                output, failure = self._post(stage, body, ctx.request_id, left)
            except (NewConnectionError, ProtocolError) as exc:
                # The request did not reach the stage (refused, reset before an
                # answer): safe to send again while the budget lasts.
                failure = StageFailure("unavailable", UNREACHABLE, detail=_reason(exc))
                if attempts <= stage.retries:
                    time.sleep(min(_BACKOFF_S * 2 ** (attempts - 1), max(0.0, left / 2)))
                    continue
            except (ConnectTimeoutError, urllib3.exceptions.TimeoutError):
                failure = StageFailure("timeout", f"no answer within {budget:.3f} s", capped)
            except HTTPError as exc:
                failure = StageFailure("unavailable", UNREACHABLE, detail=_reason(exc))
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
                failure.detail or failure.message,
            )
        return Outcome(stage, output, failure, elapsed, attempts)

    def _post(
        self, stage: StageSpec, body: bytes, request_id: str, left: float
    ) -> tuple[Output | None, StageFailure | None]:
        headers = {
            "Content-Type": "application/json",
            "X-Request-ID": request_id,
            "X-Request-Timeout": f"{left:.3f}",
        }
        if stage.api_key is not None:
            headers["Authorization"] = f"Bearer {stage.api_key}"
        tracer().inject(headers)  # the stage's span: the stage's server span is its child
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
            return None, StageFailure("invalid_response", "its answer is not a JSON object")
        message = f"HTTP {response.status}"
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            message += f" {answer['error'].get('type')}: {answer['error'].get('message')}"
        return None, StageFailure("rejected" if response.status == 400 else "status", message)

    def _infer(
        self, stage: StageSpec, params: Params, request_id: str, until: float
    ) -> tuple[Output | None, StageFailure | None, bool]:
        """One gRPC attempt: its output, or its failure and whether to send it again."""
        assert self._grpc is not None
        assert stage.url is not None
        try:
            output = self._grpc.infer(
                stage.url,
                stage.model,
                params,
                until=until,
                request_id=request_id,
                api_key=stage.api_key,
                traceparent=tracer().current(),
            )
        except StageError as exc:
            return None, StageFailure(exc.kind, exc.message, detail=exc.detail), exc.retry
        return output, None, False

    def ready(self, stages: Sequence[StageSpec]) -> bool:
        """Whether every one of ``stages`` answers its ``/readyz`` with 200; asked at
        most once per ``READINESS_TTL_S``, whoever asks meanwhile."""
        if time.monotonic() - self._ready_at < READINESS_TTL_S:
            return self._ready
        with self._ready_lock:
            if time.monotonic() - self._ready_at >= READINESS_TTL_S:
                self._ready = all(self._stage_ready(stage) for stage in stages)
                self._ready_at = time.monotonic()
        return self._ready

    def _stage_ready(self, stage: StageSpec) -> bool:
        if stage.url is None:
            return False
        if self._grpc is not None and stage.protocol == "grpc":
            return self._grpc.ready(stage.url, stage.model, READINESS_TIMEOUT_S)
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
