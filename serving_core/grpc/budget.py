"""How many calls of each kind the gRPC front holds at once (finding M1).

grpcio's sync server gives every call a thread of its pool for as long as the
call lasts, and refuses a call past ``maximum_concurrent_rpcs`` with
``RESOURCE_EXHAUSTED``. A server-reflection or health ``Watch`` stream lasts as
long as its client likes: with one shared budget, as many idle streams as
there are threads would refuse every other caller's ``ModelInfer``. So each
kind has its own budget, and the pool is their sum:

- **inference** (``ModelInfer``, ``ModelStreamInfer``): SERVING_THREADS calls,
  as a gthread worker's HTTP requests; below that admission refuses first;
- **long-lived** (reflection, health ``Watch``): ``LONG_LIVED`` streams;
- **control** (readiness, metadata, health ``Check``): ``CONTROL`` more, so that
  a probe is answered while inference is full.

A call past its kind's budget is refused at once with ``RESOURCE_EXHAUSTED``,
naming the budget, before it takes a thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

LONG_LIVED = 4
CONTROL = 4
INFERENCE_METHODS = frozenset({"ModelInfer", "ModelStreamInfer"})
LONG_LIVED_METHODS = frozenset({"ServerReflectionInfo", "Watch"})


def pool_size(threads: int) -> int:
    """The threads (and concurrent calls) the server needs for every budget."""
    return threads + LONG_LIVED + CONTROL


class _Budget:
    # A count under a plain lock, not a ``BoundedSemaphore``: a call only takes a slot
    # or is refused, never waits, and the semaphore's condition cost each call two
    # lock rounds more on grpc's threads, each a chance to give up the GIL.
    def __init__(self, name: str, size: int, fix: str) -> None:
        self._lock = threading.Lock()
        self._free = size
        self.message = f"this server holds {size} {name} calls at once, all in use; {fix}"

    def take(self) -> bool:
        with self._lock:
            if self._free <= 0:
                return False
            self._free -= 1
            return True

    def give(self) -> None:
        with self._lock:
            self._free += 1


class CallBudgets(grpc.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, threads: int) -> None:
        self._inference = _Budget(
            "inference", threads, "retry after a moment, or raise SERVING_THREADS"
        )
        self._long = _Budget(
            "long-lived (reflection, health Watch)", LONG_LIVED, "close an idle stream first"
        )
        self._control = _Budget("control", CONTROL, "retry after a moment")
        # Each method's handler, and its wrapper: grpc asks on every call, on its
        # poller thread, and a wrapper made per call cost that thread a closure and
        # a method handler each time. Only methods a servicer has are kept.
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        cached = self._wrapped.get(details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _within(handler, self._budget_of(details.method))
        self._wrapped[details.method] = (handler, wrapped)
        return wrapped

    def _budget_of(self, path: str) -> _Budget:
        method = path.rpartition("/")[2]
        if method in INFERENCE_METHODS:
            return self._inference
        if method in LONG_LIVED_METHODS:
            return self._long
        return self._control


def _within(handler: Any, budget: _Budget) -> Any:
    """``handler`` with its behaviour run only while holding a slot of ``budget``."""
    if handler.response_streaming:
        behaviour = handler.stream_stream or handler.unary_stream

        def streamed(request: Any, ctx: grpc.ServicerContext) -> Iterator[Any]:
            if not budget.take():
                ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, budget.message)
            try:
                yield from behaviour(request, ctx)
            finally:
                budget.give()

        return _same_kind(handler, streamed)
    behaviour = handler.stream_unary or handler.unary_unary

    def unary(request: Any, ctx: grpc.ServicerContext) -> Any:
        if not budget.take():
            ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, budget.message)
        try:
            return behaviour(request, ctx)
        finally:
            budget.give()

    return _same_kind(handler, unary)


def _same_kind(handler: Any, behaviour: Callable[..., Any]) -> Any:
    """A method handler of ``handler``'s kind and (de)serializers over ``behaviour``."""
    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
