"""The inference cache's key: a handler's name, version and build, the caller when
entries are per caller, and the canonical parameters.

Two requests share a key when a JSON client would call them the same request:

- object keys in any order;
- numbers by value: ``1``, ``1.0`` and ``1e0`` are one request (JSON has one
  number type, and clients differ in how they print whole floats), and so are
  ``-0.0`` and ``0``; a float that is not whole keeps its exact value
  (``0.1`` is not ``0.10000000000000002``);
- ``true`` is not ``1`` and ``false`` is not ``0``, though Python's ``bool``
  is an ``int``;
- a list and a tuple are one JSON array;
- bytes (an uploaded file) are hashed by content, and never equal a string.

Anything else (a ``set``, a ``datetime``, an object) raises ``TypeError``:
its canonical form is not obvious, so the request is not cached. The key is
``serving:cache:<name>:<version>:`` (readable in ``redis-cli --scan``) and a
128-bit BLAKE2b digest of the name, the version, the model build
(``SERVING_MODEL_REVISION``), the caller and the parameters, so keys are
short whatever the parameters weigh. The build and the caller are in the
digest only: a key names no API key, not even its hash.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from hashlib import blake2b
from typing import Any

PREFIX = "serving:cache:"
DIGEST_BYTES = 16


def key(
    name: str,
    version: str,
    params: Mapping[str, Any],
    *,
    revision: str = "",
    caller: str | None = None,
) -> str:
    """The cache key of ``params`` for this handler; ``TypeError`` if they cannot be keyed."""
    return Keyer(name, version, revision)(params, caller)


class Keyer:
    """``key`` for one handler build: its name, version and revision are hashed once."""

    def __init__(self, name: str, version: str, revision: str = "") -> None:
        self._prefix = f"{PREFIX}{name}:{version}:"
        self._base = blake2b(digest_size=DIGEST_BYTES)
        _feed(self._base, name)
        _feed(self._base, version)
        _feed(self._base, revision)

    def __call__(self, params: Mapping[str, Any], caller: str | None = None) -> str:
        """``caller``: who asks, when entries are per caller (None: shared by all)."""
        digest = self._base.copy()
        _feed(digest, caller)  # None is its own token: no caller's entries are the shared ones
        _feed(digest, params)
        return self._prefix + digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:  # noqa: PLR0912 - one branch per JSON type
    # Every token is tagged and every variable-length one length-prefixed, so no
    # two different values write the same stream.
    update = digest.update
    kind = type(value)
    # What a JSON body parses to first, by exact type: the general checks below go
    # through the numbers and Mapping ABCs, slow on the path of every request.
    if kind is str:
        data = value.encode("utf-8", "surrogatepass")
        update(b"s%d:" % len(data))
        update(data)
    elif kind is dict:
        _feed_mapping(digest, value)
    elif kind is int:
        update(b"i%d;" % value)
    elif value is None:
        update(b"n")
    elif value is True:
        update(b"t")
    elif value is False:
        update(b"f")
    elif type(value).__name__ in ("bool", "bool_"):  # numpy's, from a Parquet or CSV row
        update(b"t" if value else b"f")
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        update(b"s%d:" % len(data))
        update(data)
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        update(b"b%d:" % len(data))
        update(data)
    elif isinstance(value, numbers.Integral):
        update(b"i%d;" % int(value))
    elif isinstance(value, numbers.Real):
        number = float(value)
        if math.isfinite(number) and number.is_integer():
            update(b"i%d;" % int(number))
        else:
            update(b"d" + repr(number).encode() + b";")
    elif isinstance(value, Mapping):
        _feed_mapping(digest, value)
    elif isinstance(value, list | tuple):
        update(b"l%d:" % len(value))
        for item in value:
            _feed(digest, item)
    else:
        raise TypeError(
            f"cannot make a cache key of a {type(value).__module__}.{type(value).__qualname__}; "
            "parameters must be JSON values (or bytes) to be cached"
        )


def _feed_mapping(digest: Any, value: Mapping[Any, Any]) -> None:
    keys = list(value)
    if not all(isinstance(k, str) for k in keys):
        bad = next(k for k in keys if not isinstance(k, str))
        raise TypeError(
            f"cannot make a cache key of an object key {bad!r} "
            f"({type(bad).__name__}); JSON object keys are strings"
        )
    digest.update(b"m%d:" % len(keys))
    for k in sorted(keys):
        _feed(digest, k)
        _feed(digest, value[k])
