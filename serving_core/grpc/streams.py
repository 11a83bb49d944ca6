"""Triton's ``ModelStreamInfer`` over the front door: a stream of requests, each
answered in turn by its responses on the one stream.

A generating handler's request gets a response a chunk, as it comes (the
door's ``open_stream``, as ``/predict``'s event stream), and, when the request
asks for it (``triton_enable_empty_final_response``, tritonclient's
``enable_empty_final_response``), an empty last one marked
``triton_final_response``; any other handler's, its one answer so marked. An
error, before a chunk or after some, is a response with its
``error_message``, and the stream goes on with the next request. A client that
cancels the call lets its generation go before the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any

from serving_core.engine.stepper import Chunk
from serving_core.errors import ServingError
from serving_core.grpc import codec
from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb
from serving_core.online.door import FrontDoor, Head
from serving_core.online.streamed import Streamed
from serving_core.v2.model import Model
from serving_core.v2.request import InferRequest

FINAL = "triton_final_response"
ASKS_EMPTY_FINAL = "triton_enable_empty_final_response"


# A response, and the HTTP status of the outcome so far (200, or its error's).
Sent = tuple[Any, int]


def responses(
    model: Model,
    door: FrontDoor,
    request: Any,
    head: Head,
    on_cancel: Callable[[Callable[[], None]], bool],
) -> Generator[Sent, None, None]:
    """The responses to one request of the stream: its chunks', or its one answer.
    ``on_cancel``: grpc's ``add_callback``, so that a cancelled call lets the
    generation go at once, not when its next chunk finds the call gone."""
    asks_final = _flag(request, ASKS_EMPTY_FINAL)
    try:
        model.find(request.model_name, request.model_version or None)
        if not door.service.generates:
            parsed, answered = door.enter(head, lambda: codec.request(request), model.answer)
            reply = _response(model, parsed, answered.output, final=True)
            yield pb.ModelStreamInferResponse(infer_response=reply), 200
            return
        parsed, streamed = door.enter(head, lambda: codec.request(request), model.open_stream)
    except ServingError as exc:
        yield _error(exc)
        return
    if not on_cancel(streamed.close):
        streamed.close()  # the call has ended already
    yield from _chunks(model, parsed, streamed, asks_final)


def _chunks(
    model: Model, parsed: InferRequest, streamed: Streamed, asks_final: bool
) -> Iterator[Sent]:
    try:
        for event in streamed:
            if isinstance(event, Chunk):
                try:
                    outputs = model.outputs_of(parsed, event.output)
                except ServingError as exc:
                    yield _error(exc)
                    return
                reply = _response(model, parsed, outputs, final=False)
                yield pb.ModelStreamInferResponse(infer_response=reply), 200
            elif isinstance(event, ServingError):
                yield _error(event)
            elif asks_final:
                reply = _response(model, parsed, [], final=True)
                yield pb.ModelStreamInferResponse(infer_response=reply), 200
    finally:
        streamed.close()


def _error(error: ServingError) -> Sent:
    return pb.ModelStreamInferResponse(error_message=error.message), error.status


def _response(model: Model, parsed: InferRequest, outputs: Any, *, final: bool) -> Any:
    reply = codec.response(model.name, model.version, parsed.id, outputs, typed=parsed.typed)
    reply.parameters[FINAL].bool_param = final
    return reply


def _flag(request: Any, name: str) -> bool:
    parameter = request.parameters.get(name)
    return bool(parameter is not None and parameter.bool_param)
