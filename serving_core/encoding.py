"""JSON in and out of the wire, with orjson.

orjson encodes an embedding in a small fraction of the standard library's time,
CPU that every request would otherwise spend on the worker's hub. It also writes
numpy arrays (a handler may return ``tensor.numpy()`` rows; float32 prints its
shortest round-tripping form, half the bytes of a Python float list).
NaN and infinity have no JSON form: orjson writes them as ``null``, as
JavaScript's ``JSON.stringify`` does.

A request body is also held to a nesting depth and a string length
(``loads_limited``), checked without a second pass over the parsed objects,
which would cost more than the parse itself on a large body of small objects:

- depth: a body with no more ``[`` and ``{`` than ``max_depth`` cannot nest
  deeper, and is parsed as it is (most bodies). A body under 16 KiB has its
  brackets outside strings counted out after the parse (``_shallow``). orjson
  refuses input nested deeper than 1,024; any larger body is parsed
  inside ``1024 - max_depth`` one-element arrays, so that orjson's own limit
  is ``max_depth`` for the body; unwrapping checks that each wrapper holds
  exactly one element (a body such as ``1],[2`` cannot close them).
- strings: only a body longer than ``max_string_chars`` bytes can hold a
  longer string. Then escaped backslashes and quotes are blanked out (same
  length), every run between quotes longer than the limit is found with one
  regular-expression search, an even number of quotes before it tells a
  string from the text between two strings, and only such a string is
  decoded to count its characters.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError
_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
ORJSON_MAX_DEPTH = 1024  # orjson refuses deeper input


class TooDeep(ValueError):
    """The JSON nests deeper than allowed."""


class StringTooLong(ValueError):
    """A JSON string (a value or a key) is longer than allowed."""

    def __init__(self, chars: int) -> None:
        super().__init__(f"a string of {chars} characters")
        self.chars = chars


def dumps(value: Any) -> bytes:
    """Raises ``TypeError`` for what JSON cannot hold."""
    return orjson.dumps(value, option=_OPTIONS)


def dumps_sorted(value: Any) -> bytes:
    """``dumps`` with object keys sorted: one byte string for one JSON value, whatever
    order a client sent its keys in (what a digest of parameters hashes)."""
    return orjson.dumps(value, option=_OPTIONS | orjson.OPT_SORT_KEYS)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)


def loads_limited(data: bytes, *, max_depth: int, max_string_chars: int) -> Any:
    """``loads``, refusing JSON nested deeper than ``max_depth`` (``TooDeep``) or with a
    string longer than ``max_string_chars`` characters (``StringTooLong``).

    Malformed JSON raises ``JSONDecodeError`` with its position in ``data``.
    """
    value = _loads_to_depth(data, max_depth)
    if len(data) > max_string_chars:
        _check_strings(data, max_string_chars)
    return value


def _loads_to_depth(data: bytes, max_depth: int) -> Any:
    wrappers = ORJSON_MAX_DEPTH - max_depth
    # A body cannot nest deeper than it has brackets (those in strings count too,
    # which only errs on the safe side): most bodies skip the wrappers, which
    # cost far more than parsing a small body does.
    if wrappers <= 0 or data.count(b"[") + data.count(b"{") <= max_depth:
        return orjson.loads(data)
    if len(data) <= SCAN_DEPTH_BELOW_BYTES:
        try:
            value = orjson.loads(data)
        except JSONDecodeError as exc:
            if exc.msg.startswith("depth limit"):
                raise TooDeep(f"nested deeper than {max_depth}") from None
            raise
        if not _shallow(data, max_depth):
            raise TooDeep(f"nested deeper than {max_depth}")
        return value
    try:
        value = orjson.loads(b"[" * wrappers + data + b"]" * wrappers)
    except JSONDecodeError as exc:
        if exc.msg.startswith("depth limit"):
            raise TooDeep(f"nested deeper than {max_depth}") from None
        return orjson.loads(data)  # raises again, at the right position
    for _ in range(wrappers):
        if type(value) is not list or len(value) != 1:
            # Not one value inside the wrappers: the body closed them itself.
            return orjson.loads(data)  # raises: data alone is not JSON
        value = value[0]
    return value


_BLANK_ESCAPES = ((b"\\\\", b"__"), (b'\\"', b"__"))
# Below this size counting the brackets out (a cost per byte) is the cheaper; above
# it the wrappers' fixed cost is (bench/README.md, "The request path's own CPU").
SCAN_DEPTH_BELOW_BYTES = 16 * 1024
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _shallow(data: bytes, max_depth: int) -> bool:
    """Whether valid JSON ``data`` nests at most ``max_depth`` deep: its brackets outside
    strings (every other piece between quotes, escapes blanked) lose one level of
    innermost pairs per pass, so a body of depth d is empty after d passes."""
    text = _blank_escapes(data)
    brackets = b"".join(text.split(b'"')[::2]).translate(None, _NOT_BRACKETS)
    brackets = brackets.replace(b"{", b"[").replace(b"}", b"]")
    for _ in range(max_depth):
        if not brackets:
            return True
        brackets = brackets.replace(b"[]", b"")
    return not brackets


def _blank_escapes(data: bytes) -> bytes:
    if b"\\" in data:
        for escape, blank in _BLANK_ESCAPES:
            data = data.replace(escape, blank)
    return data


def _check_strings(data: bytes, max_chars: int) -> None:
    text = _blank_escapes(data)
    # A quote, then more than max_chars bytes without one: a string's bytes are at
    # least its characters. The pattern starts with a literal, so the search jumps
    # from quote to quote: linear in the body.
    long_run = re.compile(b'"[^"]{%d}' % (max_chars + 1))
    at = quotes = 0  # quotes: how many are in text[:at]
    while (found := long_run.search(text, at)) is not None:
        start = found.start()
        quotes += text.count(b'"', at, start)
        end = text.find(b'"', found.end())  # orjson parsed it: the string ends
        if end < 0:
            break  # the run after the last string's closing quote: no string
        if quotes % 2 == 0:  # an opening quote: this run is a string
            chars = len(orjson.loads(data[start : end + 1]))
            if chars > max_chars:
                raise StringTooLong(chars)
        quotes += 1
        at = end
