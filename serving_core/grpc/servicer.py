"""``inference.GRPCInferenceService`` over ``v2.model.Model``: the same metadata,
readiness and inference as the REST routes, through the same front door
(``online.door``: admission, the cache, this worker's batcher).

A request's deadline is its gRPC deadline (``time_remaining``), capped as any by
SERVING_REQUEST_TIMEOUT_S. A ``ServingError`` becomes the gRPC status of its
kind: a bad tensor ``INVALID_ARGUMENT`` naming the input, a full queue
``RESOURCE_EXHAUSTED`` with a ``retry-after`` (seconds) in the trailing metadata.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from serving_core.context import request_id_of
from serving_core.errors import DeadlineExceeded, NotReady, Overloaded, ServingError
from serving_core.grpc import accesslog, codec, streams
from serving_core.grpc.keys import presented
from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb
from serving_core.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from serving_core.metrics.metrics import Metrics
from serving_core.online.door import FrontDoor, Head
from serving_core.runtime import THREADS
from serving_core.tracing import traceparent
from serving_core.tracing.tracer import NO_SPAN, Span, tracer
from serving_core.v2.model import Model

log = logging.getLogger("serving_core.grpc.servicer")
SERVICE = "inference.GRPCInferenceService"
INFER_ROUTE = f"/{SERVICE}/ModelInfer"  # the method's path: its route label in the metrics
STREAM_ROUTE = f"/{SERVICE}/ModelStreamInfer"
RETRY_AFTER = "retry-after"

# By the HTTP status a ServingError carries; 5xx not named here is INTERNAL.
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_of(error: ServingError) -> grpc.StatusCode:
    if isinstance(error, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(error, NotReady):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(error, DeadlineExceeded):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    code = _CODES.get(error.status)
    if code is not None:
        return code
    return grpc.StatusCode.UNAVAILABLE if error.status == 503 else grpc.StatusCode.INTERNAL


def abort(ctx: grpc.ServicerContext, error: ServingError) -> NoReturn:
    if error.retry_after_s is not None:
        # Whole seconds, as HTTP's Retry-After: a client backs off at least that long.
        ctx.set_trailing_metadata(((RETRY_AFTER, str(max(1, math.ceil(error.retry_after_s)))),))
    ctx.abort(status_of(error), error.message)
    raise AssertionError("grpc's ServicerContext.abort always raises")  # for the type checker


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        model: Model,
        door: FrontDoor,
        metrics: Metrics | None = None,
        identify: Callable[[str], str] | None = None,
        *,
        enter: Callable[[Callable[[], Any]], Any] = THREADS.enter,
        described: bool = True,
    ) -> None:
        """``identify``: the caller identity of an API key (``web.guard.caller_of``, handed
        in by ``process``), so that a call's cache entries are its key's own, as on HTTP;
        None when the API has no keys. ``enter``: the worker's ``Runtime.enter``, through
        which a call reaches the door (on the hub of a gevent worker). ``described``:
        the metadata methods answer (not with SERVING_PRIVATE_ENDPOINTS and no keys)."""
        self.model = model
        self.door = door
        self.metrics = metrics
        self.identify = identify
        self.enter = enter
        self.described = described

    def ServerLive(self, request: Any, ctx: grpc.ServicerContext) -> Any:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, ctx: grpc.ServicerContext) -> Any:
        return pb.ServerReadyResponse(ready=self.model.ready)

    def ModelReady(self, request: Any, ctx: grpc.ServicerContext) -> Any:
        self._find(request.name, request.version, ctx)
        return pb.ModelReadyResponse(ready=self.model.ready)

    def ServerMetadata(self, request: Any, ctx: grpc.ServicerContext) -> Any:
        self._described(ctx)
        return pb.ServerMetadataResponse(**self.model.server_metadata())

    def ModelMetadata(self, request: Any, ctx: grpc.ServicerContext) -> Any:
        self._described(ctx)
        self._find(request.name, request.version, ctx)
        found = self.model.metadata()
        return pb.ModelMetadataResponse(
            name=found["name"],
            versions=found["versions"],
            platform=found["platform"],
            inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in found["inputs"]],
            outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in found["outputs"]],
        )

    def ModelInfer(self, request: Any, ctx: grpc.ServicerContext) -> Any:
        # On grpc's thread: everything that asks grpc's call (its deadline, metadata,
        # peer, abort) and the call's span, count and access line; only the door's
        # work is entered (on the hub of a gevent worker). grpc's call methods let go
        # of the GIL and take it back: on the hub, each was a wait for the GIL behind
        # grpc's other threads, with every HTTP request of the worker waiting too.
        traces = tracer()
        if not traces.enabled:
            return self._model_infer(request, ctx, NO_SPAN)
        # The call's server span, its parent the caller's ``traceparent`` metadata (a
        # pipeline's stage call sends one); the door's spans are its children (the
        # entered call runs in a copy of this thread's context).
        parent = dict(ctx.invocation_metadata()).get(traceparent.HEADER)
        attributes = {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": "ModelInfer"}
        with traces.span(
            f"{SERVICE}/ModelInfer", parent=parent, kind="server", attributes=attributes
        ) as span:
            return self._model_infer(request, ctx, span)

    def _model_infer(self, request: Any, ctx: grpc.ServicerContext, span: Span) -> Any:
        arrival = time.monotonic()
        # The client's id when HTTP's X-Request-ID would take it, else a new one: it is
        # written into the access line and the logs as it is (finding L5).
        request_id = request_id_of(request.id)
        # Counted as /predict's requests are, with the HTTP status of the outcome
        # (200, or the error's: 400, 503…), so one query covers every front.
        status, code, batch_size = 500, grpc.StatusCode.INTERNAL, None
        try:
            try:
                # No length: grpc refused a message over SERVING_MAX_BODY_BYTES unread.
                head = Head(
                    request_id=request_id,
                    arrival=arrival,
                    timeout_s=ctx.time_remaining(),  # None: the client set no deadline
                    caller=self._caller(ctx),
                )
                reply, batch_size = self.enter(lambda: self._infer(request, head))
            except ServingError as exc:
                status, code = exc.status, status_of(exc)
                if status >= 500 and not isinstance(exc, Overloaded | NotReady | DeadlineExceeded):
                    log.error("gRPC request %s: %s", request_id, exc.message)
                abort(ctx, exc)
            status, code = 200, grpc.StatusCode.OK
            return reply
        finally:
            span.answered(status)
            span.set("serving.request_id", request_id)
            self._record(
                ctx, INFER_ROUTE, status, arrival, request_id, batch_size=batch_size, code=code
            )

    def _infer(self, request: Any, head: Head) -> tuple[Any, int | None]:
        """The reply, and the size of the batch the model ran it in (None: no model call,
        e.g. a cache hit)."""
        model = self.model
        model.find(request.model_name, request.model_version or None)
        parsed, answered = self.door.enter(head, lambda: codec.request(request), model.answer)
        reply = codec.response(
            model.name, model.version, parsed.id, answered.output, typed=parsed.typed
        )
        return reply, answered.batch_size

    def ModelStreamInfer(self, requests: Iterator[Any], ctx: grpc.ServicerContext) -> Any:
        """Triton's streaming extension (``streams``): each request in turn, its
        responses as they come; each request counted and logged as a ``ModelInfer``."""
        caller = self._caller(ctx)
        for request in requests:
            arrival = time.monotonic()
            request_id = request_id_of(request.id)  # as a ModelInfer's (L5)
            head = Head(
                request_id=request_id,
                arrival=arrival,
                timeout_s=ctx.time_remaining(),
                caller=caller,
            )
            outcome = 500  # the HTTP status of the request's outcome: its error's, or 200
            answered = streams.responses(self.model, self.door, request, head, ctx.add_callback)
            try:
                # Each step on the door's side (``enter``); the requests are read here.
                while (sent := self.enter(functools.partial(next, answered, None))) is not None:
                    response, outcome = sent
                    yield response
            finally:
                self.enter(answered.close)
                self._record(ctx, STREAM_ROUTE, outcome, arrival, request_id)

    def _record(
        self,
        ctx: grpc.ServicerContext,
        route: str,
        status: int,
        arrival: float,
        request_id: str,
        *,
        batch_size: int | None = None,
        code: grpc.StatusCode = grpc.StatusCode.OK,
    ) -> None:
        """Count and log one request, as ``/predict``'s are, with the HTTP status of
        its outcome."""
        duration_s = time.monotonic() - arrival
        if self.metrics is not None:
            self.metrics.request(route, status, duration_s, "grpc")
        accesslog.log_call(
            peer=ctx.peer(),
            route=route,
            status=status,
            grpc_status=code.name,
            duration_s=duration_s,
            request_id=request_id,
            batch_size=batch_size,
            trace_id=traceparent.trace_id_of(tracer().current()),
        )

    def _caller(self, ctx: grpc.ServicerContext) -> str:
        """The key was checked by the interceptor (``keys.KeyCheck``); here it names the
        caller, whose cache entries are its own."""
        if self.identify is not None and (key := presented(ctx.invocation_metadata())):
            return self.identify(key)
        return ""

    # The model repository extension: one model, loaded before fork, never swapped.
    # Answered here, not by the generated base, which raises (a traceback in the log).
    def RepositoryModelLoad(self, request: Any, ctx: grpc.ServicerContext) -> Any:
        ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "serving-core serves one model, loaded at start")

    def RepositoryModelUnload(self, request: Any, ctx: grpc.ServicerContext) -> Any:
        ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "serving-core serves one model, loaded at start")

    def _described(self, ctx: grpc.ServicerContext) -> None:
        if not self.described:
            ctx.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                "this server does not describe itself: SERVING_PRIVATE_ENDPOINTS is on and "
                "no API keys are set (set SERVING_API_KEYS to serve metadata to key holders)",
            )

    def _find(self, name: str, version: str, ctx: grpc.ServicerContext) -> None:
        try:
            self.model.find(name, version or None)
        except ServingError as exc:
            abort(ctx, exc)
