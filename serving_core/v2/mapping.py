"""Which named tensor carries which field: the handler's ``tensors``, or what its
``input_schema`` makes unambiguous; and the rows of a batch between tensors and dicts.

Each row of the batch dimension (the first) is one parameters dict, and each
output dict one row of every output tensor. ``BYTES`` elements reach the
handler as ``str`` when they are UTF-8 text, else as ``bytes``; the schema
then says whether that is what the field takes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving_core.errors import BadRequest, ServingError, quote
from serving_core.handler import Handler, Output, Params, Tensor
from serving_core.v2.datatypes import FLOATS, INTEGERS, NUMBERS, NUMPY, of_array
from serving_core.v2.tensors import MAX_RANK, Array

# A JSON Schema type -> (the datatype metadata reports, the datatypes accepted).
_SCALARS: dict[str, tuple[str, frozenset[str]]] = {
    "string": ("BYTES", frozenset({"BYTES"})),
    "integer": ("INT64", INTEGERS),
    "number": ("FP64", NUMBERS),
    "boolean": ("BOOL", frozenset({"BOOL"})),
}


class OutputNotTensor(ServingError):
    """The handler's output has no tensor form: the handler's fault, not the client's."""

    status = 500
    type = "output_not_tensor"


@dataclass(frozen=True)
class Input:
    tensor: Tensor
    accepts: frozenset[str]


class TensorMap:
    """The inputs a model takes and the outputs it declares (None: its output's keys)."""

    def __init__(self, handler: Handler) -> None:
        declared = type(handler).tensors
        if declared is not None:
            self.inputs = {t.name: Input(t, frozenset({t.datatype})) for t in declared.inputs}
            self.outputs: tuple[Tensor, ...] | None = declared.outputs
            self.open = False
        else:
            properties = (handler.input_schema or {}).get("properties")
            found = properties.items() if isinstance(properties, Mapping) else ()
            self.inputs = {
                name: spec for name, prop in found if (spec := _inferred(name, prop)) is not None
            }
            self.outputs = None
            # No schema to say which fields there are: any tensor is the field of its name.
            self.open = not isinstance(properties, Mapping)

    def rows(self, inputs: Mapping[str, tuple[str, Array]], max_rows: int) -> list[Params]:
        """One parameters dict per row of the batch dimension of ``inputs``
        (name -> (datatype, array))."""
        batch = None
        columns: dict[str, list[Any]] = {}
        for name, (datatype, tensor) in inputs.items():
            # A scalar (shape []): one row of one value.
            array = tensor.reshape(1) if tensor.ndim == 0 else tensor
            spec = self.inputs.get(name)
            if spec is None and not self.open:
                known = ", ".join(map(repr, self.inputs)) or "none that V2 can carry"
                raise BadRequest(
                    f"input {quote(name)} is not an input of this model; its inputs: {known}"
                )
            if spec is not None and datatype not in spec.accepts:
                raise BadRequest(
                    f"input {quote(name)}: datatype {datatype}, and it takes {_kinds(spec)}"
                )
            rows = array.shape[0]
            if batch is not None and rows != batch:
                raise BadRequest(
                    f"input {quote(name)}: {rows} rows in its first (batch) dimension, and "
                    f"the other inputs have {batch}; send one row per request in every input"
                )
            batch = rows
            key = spec.tensor.key if spec is not None else name
            columns[key] = _column(name, array, spec.tensor.shape if spec is not None else None)
        if not batch:
            raise BadRequest("the request has no rows: its inputs' first (batch) dimension is 0")
        if batch > max_rows:
            raise BadRequest(
                f"the request has {batch} rows, more than SERVING_MAX_QUEUE={max_rows} lets "
                "wait at once; send fewer rows per request"
            )
        return [{key: column[row] for key, column in columns.items()} for row in range(batch)]

    def metadata_inputs(self) -> list[dict[str, Any]]:
        return [_metadata(spec.tensor) for spec in self.inputs.values()]

    def metadata_outputs(self) -> list[dict[str, Any]]:
        return [_metadata(tensor) for tensor in self.outputs or ()]

    def output_arrays(self, outputs: Sequence[Output]) -> list[tuple[str, str, Array]]:
        """The output tensors of the batch's answers: (name, datatype, array). An
        undeclared key that no tensor holds (None, dicts, rows of different shapes) is
        left out; a declared output that does not fit is the handler's error."""
        if self.outputs is not None:
            return [(t.name, *_array(t, _values(t, outputs))) for t in self.outputs]
        found = []
        for key in outputs[0]:
            tensor = Tensor(str(key), "")
            try:
                found.append((tensor.name, *_array(tensor, _values(tensor, outputs))))
            except OutputNotTensor:
                continue
        return found


def _values(tensor: Tensor, outputs: Sequence[Output]) -> list[Any]:
    values = []
    for output in outputs:
        if tensor.key not in output:
            raise OutputNotTensor(
                f"an output of the handler has no {tensor.key!r}, which Handler.tensors "
                "(or another row) has; return the same keys for every row"
            )
        values.append(output[tensor.key])
    return values


def _inferred(name: str, prop: Any) -> Input | None:
    """The tensor of one schema property, if its type says it (else the field has none)."""
    depth = 0
    while isinstance(prop, Mapping) and prop.get("type") == "array" and depth < MAX_RANK - 1:
        prop, depth = prop.get("items"), depth + 1
    if not isinstance(prop, Mapping) or prop.get("type") not in _SCALARS:
        return None
    datatype, accepts = _SCALARS[prop["type"]]
    return Input(Tensor(name, datatype, (-1,) * depth), accepts)


def _undeclared(datatype: str | None) -> str | None:
    """An undeclared output's datatype: the JSON kind of its values (FP64, INT64), so
    that an answer from the cache (stored as JSON) has the one the model's had."""
    if datatype in FLOATS:
        return "FP64"
    if datatype in INTEGERS:
        return "INT64"
    return datatype


def _kinds(spec: Input) -> str:
    if spec.accepts == NUMBERS:
        return "a number (INT*, UINT* or FP*)"
    if spec.accepts == INTEGERS:
        return "an integer (INT* or UINT*)"
    return " or ".join(sorted(spec.accepts))


def _metadata(tensor: Tensor) -> dict[str, Any]:
    # -1 first: the batch dimension, any number of rows.
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": [-1, *tensor.shape]}


def _column(name: str, array: Array, shape: tuple[int, ...] | None) -> list[Any]:
    rest = array.shape[1:]
    if shape == () and rest == (1,):
        rest, array = (), array.reshape(array.shape[0])  # [batch, 1] for one value a row
    if shape is not None and (
        len(rest) != len(shape)
        or any(want not in (-1, got) for want, got in zip(shape, rest, strict=True))
    ):
        wanted = ", ".join(["batch", *("any" if size == -1 else str(size) for size in shape)])
        raise BadRequest(
            f"input {quote(name)}: shape {list(array.shape)}, and it takes [{wanted}]"
            + ("; or [batch, 1]" if shape == () else "")
        )
    values: list[Any] = array.tolist()
    return _texts(values) if array.dtype == object else values


def _texts(value: Any) -> Any:
    if isinstance(value, list):
        return [_texts(item) for item in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def _array(tensor: Tensor, values: list[Any]) -> tuple[str, Array]:
    where = f"the handler's output {tensor.key!r}"
    try:
        array = np.asarray(values)
    except ValueError:
        raise OutputNotTensor(
            f"{where} has rows of different shapes, which no tensor holds; return one shape "
            "per row (pad it) or leave it out of Handler.tensors' outputs"
        ) from None
    datatype = tensor.datatype or _undeclared(of_array(array))
    if datatype is None or datatype not in NUMPY:
        raise OutputNotTensor(f"{where} is {array.dtype}, which has no V2 datatype")
    if datatype == "BYTES":
        array = array.astype(object)
        if not all(isinstance(item, str | bytes) for item in array.ravel()):
            raise OutputNotTensor(
                f"{where} holds values that are neither numbers nor text (dicts, None or "
                "mixed), which no tensor holds; declare Handler.tensors without it"
            )
    else:
        try:
            array = array.astype(NUMPY[datatype])
        except (TypeError, ValueError):
            raise OutputNotTensor(f"{where} cannot be {datatype}") from None
    rest = array.shape[1:]
    if tensor.datatype and (
        len(rest) != len(tensor.shape)
        or any(want not in (-1, got) for want, got in zip(tensor.shape, rest, strict=True))
    ):
        raise OutputNotTensor(
            f"{where} has shape {list(rest)} a row, and Handler.tensors says {list(tensor.shape)}"
        )
    return datatype, array
