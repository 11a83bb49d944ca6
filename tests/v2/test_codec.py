"""The V2 tensor codec (serving_core/v2): every datatype through JSON and raw bytes,
the batch rows it makes, and the 400 that names a bad tensor."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import numpy as np
import pytest

from serving_core.errors import BadRequest
from serving_core.handler import Handler
from serving_core.v2 import request as v2request
from serving_core.v2.datatypes import DATATYPES
from serving_core.v2.mapping import TensorMap
from serving_core.v2.tensors import from_json, from_raw, to_json, to_raw

SAMPLES = {
    "BOOL": [True, False, True, True],
    "INT8": [-128, 0, 5, 127],
    "INT16": [-3, 0, 5, 30000],
    "INT32": [-3, 0, 5, 2**31 - 1],
    "INT64": [-(2**63), 0, 5, 2**63 - 1],
    "UINT8": [0, 1, 200, 255],
    "UINT16": [0, 1, 2, 65535],
    "UINT32": [0, 1, 2, 2**32 - 1],
    "UINT64": [0, 1, 2, 2**64 - 1],
    "FP16": [0.5, -2.0, 65504.0, 1.0],
    "FP32": [0.25, -1.5, 3.0, 2.0**100],
    "FP64": [0.1, -1e300, 3.0, 2.5],
    "BYTES": ["a", "", "\u00e9t\u00e9", "x" * 300],
}


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_through_json_and_raw_bytes(datatype: str) -> None:
    nested = [SAMPLES[datatype][:2], SAMPLES[datatype][2:]]
    array = from_json("t", datatype, (2, 2), nested)
    assert array.shape == (2, 2)
    assert from_json("t", datatype, (2, 2), SAMPLES[datatype]).tolist() == array.tolist()
    raw = to_raw(array, datatype)
    assert from_raw("t", datatype, (2, 2), raw).tolist() == array.tolist()
    if datatype != "BYTES":
        assert to_json(array, datatype) == SAMPLES[datatype]


def test_bytes_travel_length_prefixed_little_endian() -> None:
    array = from_json("t", "BYTES", (2,), ["ab", "c"])
    assert to_raw(array, "BYTES") == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"


@pytest.mark.parametrize(
    ("tensor", "says"),
    [
        ({"datatype": "FP32", "shape": [2], "data": [1.0]}, "holds 2 elements, and data has 1"),
        ({"datatype": "INT8", "shape": [1], "data": [300]}, "out of the range of INT8"),
        ({"datatype": "UINT8", "shape": [1], "data": [-1]}, "out of the range of UINT8"),
        ({"datatype": "FP16", "shape": [1], "data": [1e6]}, "out of the range of FP16"),
        ({"datatype": "INT32", "shape": [1], "data": [1.5]}, "INT32 data must be integers"),
        ({"datatype": "BOOL", "shape": [1], "data": [1]}, "BOOL data must be true or false"),
        ({"datatype": "BYTES", "shape": [1], "data": [1]}, "BYTES data must be strings"),
        ({"datatype": "BF16", "shape": [1], "data": [1]}, "datatype 'BF16' is not one of"),
        ({"datatype": "FP32", "shape": [-1], "data": [1]}, "shape [-1] is not a list"),
        ({"datatype": "FP32", "shape": [1], "data": 1.0}, "data must be an array"),
        ({"datatype": "FP32", "shape": [1]}, 'has no "data"'),
    ],
)
def test_a_bad_tensor_is_a_bad_request_that_names_it(tensor: dict, says: str) -> None:
    with pytest.raises(BadRequest) as refused:
        v2request.parse({"inputs": [{"name": "x0", **tensor}]})
    assert "'x0'" in refused.value.message
    assert says in refused.value.message


@pytest.mark.parametrize(
    ("sizes", "binary", "says"),
    [
        ([8], b"\x00" * 4, "runs past the 4 bytes"),
        ([8], b"\x00" * 12, "4 bytes after the JSON belong to no input"),
        ([4], b"\x00" * 4, "4 bytes of binary data, and shape [2] of FP32 takes 8"),
    ],
)
def test_binary_data_must_fill_each_tensor_exactly(
    sizes: list[int], binary: bytes, says: str
) -> None:
    inputs = [
        {"name": "x0", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": n}}
        for n in sizes
    ]
    with pytest.raises(BadRequest, match=re.escape(says)):
        v2request.parse({"inputs": inputs}, binary)


class Schema(Handler):
    input_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "scores": {"type": "array", "items": {"type": "number"}},
            "anything": {},
        },
    }


def test_the_schema_maps_each_typed_field_to_a_tensor_of_its_name() -> None:
    tensors = TensorMap(Schema())
    assert tensors.metadata_inputs() == [
        {"name": "text", "datatype": "BYTES", "shape": [-1]},
        {"name": "scores", "datatype": "FP64", "shape": [-1, -1]},
    ]
    rows = tensors.rows(
        {
            "text": ("BYTES", from_json("text", "BYTES", (2, 1), ["a", "b"])),
            "scores": ("INT32", from_json("scores", "INT32", (2, 2), [1, 2, 3, 4])),
        },
        max_rows=8,
    )
    assert rows == [{"text": "a", "scores": [1, 2]}, {"text": "b", "scores": [3, 4]}]
    with pytest.raises(BadRequest, match="input 'anything' is not an input of this model"):
        tensors.rows({"anything": ("FP32", np.zeros(1, dtype=np.float32))}, max_rows=8)
    with pytest.raises(BadRequest, match="more than SERVING_MAX_QUEUE=1"):
        tensors.rows({"text": ("BYTES", from_json("text", "BYTES", (2,), ["a", "b"]))}, 1)


def test_an_undeclared_output_that_no_tensor_holds_is_left_out() -> None:
    answers = [{"a": 1, "b": None, "c": [1]}, {"a": 2.5, "b": None, "c": [1, 2]}]
    arrays = TensorMap(Schema()).output_arrays(answers)
    assert [(name, datatype, array.tolist()) for name, datatype, array in arrays] == [
        ("a", "FP64", [1.0, 2.5])
    ]
