"""V2's tensor datatypes and the numpy dtypes that hold them.

A tensor's raw bytes (the binary tensor extension over REST, ``raw_input_contents``
over gRPC) are little-endian whatever the machine: the dtypes here say so.
``BYTES`` elements are held as Python ``bytes`` in an object array.
"""

from __future__ import annotations

import numpy as np

NUMPY: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
DATATYPES = tuple(NUMPY)
INTEGERS = frozenset(name for name in DATATYPES if "INT" in name)
FLOATS = frozenset({"FP16", "FP32", "FP64"})
NUMBERS = INTEGERS | FLOATS


def of_array(array: np.ndarray[tuple[int, ...], np.dtype[np.generic]]) -> str | None:
    """The V2 datatype of a numpy array's elements, or None (no V2 form)."""
    kind, size = array.dtype.kind, array.dtype.itemsize
    if kind == "b":
        return "BOOL"
    if kind in "iu" and size in (1, 2, 4, 8):
        return f"{'U' if kind == 'u' else ''}INT{size * 8}"
    if kind == "f" and size in (2, 4, 8):
        return f"FP{size * 8}"
    if kind in "SUO":
        return "BYTES"  # str and bytes; an object array's elements are checked on encoding
    return None
