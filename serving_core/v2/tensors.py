"""One V2 tensor between its wire forms and a numpy array: JSON ``data`` (nested or
flat, row-major), or raw little-endian bytes (``BYTES``: each element a 4-byte
length, then its bytes), as the REST binary extension and gRPC's raw contents carry it.

Whatever a client sends, a bad tensor is a ``BadRequest`` that names it: a shape
that is not a list of sizes, data of another datatype, too few or too many elements.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from serving_core.errors import BadRequest, quote
from serving_core.v2.datatypes import DATATYPES, FLOATS, INTEGERS, NUMPY

Array = np.ndarray[Any, Any]
MAX_RANK = 16
# A shape's sizes other than 0 multiply to at most this many elements: more than any body
# holds, and a zero-size tensor of [1, 0, 2**62] has no array to be reshaped into.
MAX_ELEMENTS = 1 << 32
_LENGTH = struct.Struct("<I")
_LARGEST = {"FP16": 65504.0, "FP32": float(np.finfo(np.float32).max), "FP64": math.inf}


def check_datatype(name: str, datatype: Any) -> str:
    if not isinstance(datatype, str) or datatype not in NUMPY:
        raise BadRequest(
            f"input {quote(name)}: datatype {quote(datatype)} is not one of {', '.join(DATATYPES)}"
        )
    return str(datatype)


def check_shape(name: str, shape: Any) -> tuple[int, ...]:
    """A tensor's shape: its first size the batch, or ``[]``, a scalar (one row)."""
    ok = isinstance(shape, list) and len(shape) <= MAX_RANK
    if not ok or not all(type(size) is int and size >= 0 for size in shape):
        raise BadRequest(
            f"input {quote(name)}: shape {quote(shape)} is not a list of 0 to {MAX_RANK} "
            "sizes (integers >= 0), the first one the batch; send e.g. [1, 384]"
        )
    if math.prod(size for size in shape if size) > MAX_ELEMENTS:
        raise BadRequest(
            f"input {quote(name)}: shape {quote(shape)} is larger than any tensor this "
            f"server takes (its sizes multiply to more than {MAX_ELEMENTS}); send the "
            "tensor's real shape"
        )
    return tuple(shape)


def check_chars(name: str, datatype: str, array: Array, max_chars: int) -> None:
    """A ``BYTES`` tensor's elements within ``max_chars`` (SERVING_MAX_STRING_CHARS),
    as a JSON body's strings are: counted in characters when they are UTF-8 text."""
    if datatype != "BYTES":
        return
    for index, item in enumerate(array.ravel().tolist()):
        # Never fewer bytes than characters: only a long element needs decoding.
        if len(item) > max_chars and len(_text(item)) > max_chars:
            raise BadRequest(
                f"input {quote(name)}: BYTES element {index} is longer than "
                f"SERVING_MAX_STRING_CHARS={max_chars} characters; send shorter elements"
            )


def from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> Array:
    """The tensor of a JSON ``data``: an array of elements, nested or flat (a scalar's
    may be the element alone)."""
    flat = _flatten(name, [data] if shape == () and not isinstance(data, list) else data)
    count = math.prod(shape)
    if len(flat) != count:
        raise BadRequest(
            f"input {quote(name)}: shape {list(shape)} holds {count} elements, "
            f"and data has {len(flat)}; send as many as the shape says"
        )
    if datatype == "BYTES":
        return _bytes_array(name, flat, shape)
    if datatype == "BOOL":
        wanted: tuple[type, ...] = (bool,)
    elif datatype in INTEGERS:
        wanted = (int,)
    else:
        wanted = (int, float)
    if not all(type(item) in wanted for item in flat):
        bad = next(item for item in flat if type(item) not in wanted)
        kind = "integers" if datatype in INTEGERS else "numbers"
        kind = "true or false" if datatype == "BOOL" else kind
        raise BadRequest(f"input {quote(name)}: {datatype} data must be {kind}, not {quote(bad)}")
    dtype = NUMPY[datatype]
    try:
        if datatype in FLOATS:
            wide = np.array(flat, dtype=np.float64)
            if not np.all(np.abs(wide) <= _LARGEST[datatype]):
                raise OverflowError
            array = wide.astype(dtype)
        else:
            array = np.array(flat, dtype=dtype)
    except OverflowError:
        raise BadRequest(
            f"input {quote(name)}: a value is out of the range of {datatype}; send a wider "
            "datatype or smaller values"
        ) from None
    return array.reshape(shape)


def from_raw(name: str, datatype: str, shape: tuple[int, ...], raw: bytes) -> Array:
    """The tensor of raw little-endian bytes (``BYTES``: length-prefixed elements)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return _bytes_array(name, _split_bytes(name, raw, count), shape)
    dtype = NUMPY[datatype]
    if len(raw) != count * dtype.itemsize:
        raise BadRequest(
            f"input {quote(name)}: {len(raw)} bytes of binary data, and shape {list(shape)} "
            f"of {datatype} takes {count * dtype.itemsize}; send the whole tensor, row-major"
        )
    if datatype == "BOOL":
        array: Array = np.frombuffer(raw, dtype=np.uint8) != 0
    else:
        array = np.frombuffer(raw, dtype=dtype)
    return array.reshape(shape)


def to_json(array: Array, datatype: str) -> list[Any]:
    """The tensor's elements as a flat JSON array (BYTES as UTF-8 text)."""
    if datatype == "BYTES":
        return [_text(item) for item in array.ravel().tolist()]
    return list(array.ravel().tolist())


def to_raw(array: Array, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for item in array.ravel().tolist():
            data = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts += [_LENGTH.pack(len(data)), data]
        return b"".join(parts)
    if datatype == "BOOL":
        return array.astype(np.uint8).tobytes()
    return np.ascontiguousarray(array, dtype=NUMPY[datatype]).tobytes()


def _text(item: Any) -> str:
    if isinstance(item, bytes):
        # JSON has no form for bytes that are not UTF-8; a client that sends such
        # asks for binary_data, which carries them whole.
        return item.decode("utf-8", "replace")
    return str(item)


def _flatten(name: str, data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise BadRequest(
            f"input {quote(name)}: data must be an array of the elements (nested or flat), "
            f"not {quote(data)}; or send them as binary data"
        )
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _bytes_array(name: str, items: list[Any], shape: tuple[int, ...]) -> Array:
    array = np.empty(len(items), dtype=object)
    for index, item in enumerate(items):
        if isinstance(item, bytes):
            array[index] = item
        elif isinstance(item, str):
            try:
                array[index] = item.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(
                    f"input {quote(name)}: element {index} is not valid Unicode text"
                ) from None
        else:
            raise BadRequest(f"input {quote(name)}: BYTES data must be strings, not {quote(item)}")
    return array.reshape(shape)


def _split_bytes(name: str, raw: bytes, count: int) -> list[Any]:
    items: list[Any] = []
    offset, end = 0, len(raw)
    while offset < end:
        if offset + 4 > end:
            raise BadRequest(f"input {quote(name)}: BYTES data ends inside an element's length")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > end:
            raise BadRequest(
                f"input {quote(name)}: BYTES element {len(items)} says {length} bytes, and "
                f"{end - offset} are left; prefix each element with its 4-byte little-endian length"
            )
        items.append(raw[offset : offset + length])
        offset += length
    if len(items) != count:
        raise BadRequest(
            f"input {quote(name)}: the shape holds {count} elements, and the binary data "
            f"has {len(items)}; send as many as the shape says"
        )
    return items
