"""V2 gRPC messages to and from ``v2.request.InferRequest`` and ``v2.model.Outputs``.

A tensor comes as ``raw_input_contents`` (one entry per input, little-endian, as
tritonclient sends it) or as the typed ``contents`` field of its datatype; both
decode through ``v2.tensors`` (``from_raw``, ``from_json``), so a bad tensor is
the same ``BadRequest`` naming the input as over REST. Outputs go back the way
the inputs came: as ``raw_output_contents`` after raw inputs (tritonclient's
way, and what it reads), in each output's typed ``contents`` after typed ones
(KServe's clients and grpcurl read those). The OIP allows one or the other in
a response, so an output with no typed field (FP16) sends them all raw.
"""

from __future__ import annotations

from typing import Any

from serving_core.errors import BadRequest, quote
from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb
from serving_core.v2.model import Outputs
from serving_core.v2.request import MAX_TENSORS, InferRequest
from serving_core.v2.tensors import Array, check_datatype, check_shape, from_json, from_raw, to_raw

# The typed field of InferTensorContents that carries each datatype (FP16: raw only).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def request(message: Any) -> InferRequest:
    """The ``InferRequest`` of a ``ModelInferRequest``."""
    inputs = list(message.inputs)
    raws = list(message.raw_input_contents)
    if not inputs:
        raise BadRequest("the inference request has no inputs; send at least one tensor")
    if len(inputs) > MAX_TENSORS or len(message.outputs) > MAX_TENSORS:
        raise BadRequest(f"more than {MAX_TENSORS} inputs or outputs; send fewer")
    if raws and len(raws) != len(inputs):
        raise BadRequest(
            f"raw_input_contents has {len(raws)} entries for {len(inputs)} inputs; send one "
            "per input, in the inputs' order (or none, and each input's contents)"
        )
    decoded: dict[str, tuple[str, Array]] = {}
    for index, tensor in enumerate(inputs):
        name = tensor.name
        if name in decoded:
            raise BadRequest(f"input {quote(name)} is given twice; send each input once")
        datatype = check_datatype(name, tensor.datatype)
        shape = check_shape(name, list(tensor.shape))
        if raws:
            array = from_raw(name, datatype, shape, raws[index])
        else:
            array = from_contents(name, datatype, shape, tensor)
        decoded[name] = (datatype, array)
    asked = tuple(output.name for output in message.outputs) or None
    return InferRequest(decoded, id=message.id or None, outputs=asked, typed=not raws)


def from_contents(name: str, datatype: str, shape: tuple[int, ...], tensor: Any) -> Array:
    field = _CONTENTS.get(datatype)
    if field is None:
        raise BadRequest(
            f"input {quote(name)}: {datatype} has no typed contents field; send it in "
            "raw_input_contents (little-endian)"
        )
    return from_json(name, datatype, shape, list(getattr(tensor.contents, field)))


def response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Outputs,
    *,
    typed: bool = False,
) -> Any:
    """The ``ModelInferResponse`` of ``outputs``; in typed ``contents`` when ``typed``
    (``InferRequest.typed``) and every output has a typed field."""
    reply = pb.ModelInferResponse(
        model_name=model_name, model_version=model_version, id=request_id or ""
    )
    typed = typed and all(datatype in _CONTENTS for _, datatype, _ in outputs)
    for name, datatype, array in outputs:
        tensor = reply.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if typed:
            getattr(tensor.contents, _CONTENTS[datatype]).extend(_elements(array, datatype))
        else:
            reply.raw_output_contents.append(to_raw(array, datatype))
    return reply


def _elements(array: Array, datatype: str) -> list[Any]:
    items: list[Any] = array.ravel().tolist()
    if datatype == "BYTES":
        return [item if isinstance(item, bytes) else str(item).encode("utf-8") for item in items]
    return items
