"""A pipeline's gRPC stages: a parameters dict to a V2 ``ModelInfer`` with tensors, and
the output tensors back to a dict: the ``pipeline.transport`` the command line
provides, which ``pipeline.client`` calls for ``grpc_env`` stages.

Each field the model takes (its ``ModelMetadata``, asked once per worker and model,
then cached) goes as one row of a tensor of the datatype the model declares (int64
ids stay int64, never JSON numbers); fields it does not take stay behind, as an
HTTP stage's schema would ignore them. Each output tensor's one row comes back as
a list (or a scalar) under its name. Failures are ``StageError``s that say whether
the call may be sent again: ``UNAVAILABLE`` and ``RESOURCE_EXHAUSTED`` mean the
model never ran it (refused connection, admission control), like HTTP's refused
connection; anything else is final.

Channels are made on first use, in the worker (after fork: a channel must not
cross a fork), ``CHANNELS`` per target, each its own HTTP/2 connection, the calls
taken round-robin: the target's workers share one port through SO_REUSEPORT,
which spreads connections, not calls, so one connection would put every call of
this worker on one of the target's workers. grpcio's calls
block natively: a pipeline with gRPC stages runs on gthread workers (``pipeline.pipeline.load``
refuses gevent's).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import numpy as np

from serving_core.errors import BadRequest
from serving_core.grpc.codec import from_contents
from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb
from serving_core.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from serving_core.pipeline.transport import StageError
from serving_core.v2.datatypes import NUMPY
from serving_core.v2.tensors import check_datatype, check_shape, from_raw, to_raw

# The model never ran the call: sending it again is safe.
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
UNREACHABLE = "gRPC UNAVAILABLE: down, overloaded or unreachable; the server's log has more"
# Connections per target. With W workers behind the port, the chance that all of them
# land on one worker is W * (1/W)**CHANNELS: 1/128 for two workers.
CHANNELS = 8
CHANNEL_OPTIONS = [
    # Each channel its own connection: grpc shares one between channels of the same
    # target and arguments unless told not to.
    ("grpc.use_local_subchannel_pool", 1),
    # A name that resolves to several addresses (a headless Service's pods) spreads
    # calls over them, not over the first one only (grpc's default, pick_first).
    ("grpc.lb_policy_name", "round_robin"),
]


class GrpcStages:
    """One worker's channels to its gRPC stages and the models' inputs, cached."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stubs: dict[str, list[Any]] = {}
        self._turn = 0
        self._inputs: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {}

    def infer(
        self,
        target: str,
        model: str,
        params: dict[str, Any],
        *,
        until: float,
        request_id: str,
        api_key: str | None,
        traceparent: str | None = None,
    ) -> dict[str, Any]:
        """``params`` as ``model``'s input tensors at ``target``; raises ``StageError``."""
        metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )
        if traceparent is not None:
            metadata += (("traceparent", traceparent),)
        inputs = self._model_inputs(target, model, until, metadata)
        request = pb.ModelInferRequest(model_name=model, id=request_id)
        for name, datatype in inputs:
            if name not in params:
                raise StageError(
                    "status",
                    f"the request has no field {name!r}, which model {model!r} takes; "
                    "give it to the stage (from the request or an earlier stage)",
                )
            try:
                array = np.asarray([params[name]], dtype=NUMPY[datatype])
            except (TypeError, ValueError, OverflowError):
                raise StageError(
                    "status", f"field {name!r} is not a {datatype} tensor as model {model!r} takes"
                ) from None
            request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
            request.raw_input_contents.append(to_raw(array, datatype))
        reply = self._call(self._stub(target).ModelInfer, request, until, metadata)
        return _outputs(reply)

    def ready(self, target: str, model: str, timeout_s: float) -> bool:
        try:
            answer = self._stub(target).ModelReady(
                pb.ModelReadyRequest(name=model), timeout=timeout_s
            )
        except grpc.RpcError:
            return False
        return bool(answer.ready)

    def _model_inputs(
        self, target: str, model: str, until: float, metadata: tuple[tuple[str, str], ...]
    ) -> tuple[tuple[str, str], ...]:
        found = self._inputs.get((target, model))
        if found is None:
            request = pb.ModelMetadataRequest(name=model)
            answer = self._call(self._stub(target).ModelMetadata, request, until, metadata)
            found = tuple((tensor.name, tensor.datatype) for tensor in answer.inputs)
            if not found or any(datatype not in NUMPY for _, datatype in found):
                raise StageError(
                    "invalid_response", f"model {model!r}'s metadata names no inputs V2 carries"
                )
            self._inputs[(target, model)] = found
        return found

    def _stub(self, target: str) -> Any:
        with self._lock:
            stubs = self._stubs.get(target)
            if stubs is None:
                stubs = [
                    pb_grpc.GRPCInferenceServiceStub(  # type: ignore[no-untyped-call]
                        grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
                    )
                    for _ in range(CHANNELS)
                ]
                self._stubs[target] = stubs
            self._turn += 1
            return stubs[self._turn % len(stubs)]

    @staticmethod
    def _call(method: Any, request: Any, until: float, metadata: Any) -> Any:
        left = until - time.monotonic()
        if left <= 0:
            raise StageError("timeout", "")
        try:
            return method(request, timeout=left, metadata=metadata)
        except grpc.RpcError as exc:
            raise _error(exc) from None


def _error(exc: grpc.RpcError) -> StageError:
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return StageError("timeout", "", detail=details)
    if code == grpc.StatusCode.UNAVAILABLE:
        # grpcio's words name the address it tried: the log's, not the client's.
        return StageError("unavailable", UNREACHABLE, retry=True, detail=details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return StageError("unavailable", f"gRPC RESOURCE_EXHAUSTED: {details}", retry=True)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return StageError("rejected", f"gRPC INVALID_ARGUMENT: {details}")
    return StageError("status", f"gRPC {code.name}: {details}")


def _outputs(reply: Any) -> dict[str, Any]:
    raws = list(reply.raw_output_contents)
    output: dict[str, Any] = {}
    for index, tensor in enumerate(reply.outputs):
        try:
            datatype = check_datatype(tensor.name, tensor.datatype)
            shape = check_shape(tensor.name, list(tensor.shape))
            if raws:
                array = from_raw(tensor.name, datatype, shape, raws[index])
            else:
                array = from_contents(tensor.name, datatype, shape, tensor)
        except (BadRequest, IndexError) as exc:
            raise StageError("invalid_response", f"its output {tensor.name!r}: {exc}") from None
        if not shape or shape[0] != 1:
            raise StageError(
                "invalid_response", f"its output {tensor.name!r} has {list(shape)}, not one row"
            )
        output[tensor.name] = array[0].tolist()
    return output
