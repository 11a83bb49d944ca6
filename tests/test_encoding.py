from __future__ import annotations

import orjson
import pytest

from serving_core import encoding


def limited(data: bytes, max_depth: int = 8, max_string_chars: int = 16):
    return encoding.loads_limited(data, max_depth=max_depth, max_string_chars=max_string_chars)


def nested(depth: int) -> bytes:
    return b'{"a":' * (depth - 1) + b"[]" + b"}" * (depth - 1)


@pytest.mark.parametrize("depth", [1, 7, 8])
def test_json_as_deep_as_the_limit_parses_as_orjson_parses_it(depth):
    data = nested(depth)
    assert limited(data) == orjson.loads(data)


@pytest.mark.parametrize("depth", [9, 100, 1024, 2000])
def test_json_deeper_than_the_limit_is_refused(depth):
    with pytest.raises(encoding.TooDeep):
        limited(nested(depth))


def test_a_shallow_body_with_more_brackets_than_the_limit_parses_through_the_wrappers():
    # Fewer brackets than the limit skip the wrappers; these 21 (depth 2) go through them.
    data = b'[{"a": "[[["}, ' + b", ".join([b"[]"] * 19) + b"]"
    assert limited(data) == orjson.loads(data)


def test_the_depth_limit_can_be_orjsons_own():
    assert limited(b"[" * 1024 + b"]" * 1024, max_depth=1024) is not None
    with pytest.raises(encoding.JSONDecodeError):
        limited(b"[" * 1025 + b"]" * 1025, max_depth=1024)


# Large, with more brackets than the limit: parsed inside the wrappers.
BIG = (
    b'{"p": "'
    + b" " * encoding.SCAN_DEPTH_BELOW_BYTES
    + b'", "b": [[1], [2], [3], [4], [5], [6], [7], [8], [9]]}'
)


@pytest.mark.parametrize(
    "data",
    [b"1],[" + BIG, BIG + b"],[" + BIG, BIG + b"] , [ " + BIG, BIG + b"]", b"[" + BIG, BIG + b" x"],
)
def test_a_body_cannot_close_the_wrappers_of_the_depth_check(data):
    assert BIG.count(b"[") > 8
    assert limited(BIG, max_string_chars=1 << 20) == orjson.loads(BIG)
    with pytest.raises(encoding.JSONDecodeError):
        limited(data, max_string_chars=1 << 20)


def test_malformed_json_is_reported_where_it_is_in_the_body():
    with pytest.raises(encoding.JSONDecodeError) as caught:
        limited(b'{"a":\n  1 2}')
    assert (caught.value.lineno, caught.value.colno) == (2, 5)


@pytest.mark.parametrize(
    "value",
    [
        {"k": "x" * 16},
        {"x" * 16: 1},
        {"k": "\u00e9" * 16},  # 32 bytes, 16 characters
        {"k": "\\" * 16},  # escaped: 32 bytes
        {"k": '"' * 16},
        {"k": "\u0001" * 16},  # \u0001 escapes: 96 bytes
        {"n": list(range(100)), "s": "short"},  # a long run with no string in it
    ],
)
def test_strings_up_to_the_limit_pass(value):
    assert limited(orjson.dumps(value)) == value


@pytest.mark.parametrize(
    "value",
    [
        {"k": "x" * 17},
        {"x" * 17: 1},
        {"k": "\u00e9" * 17},
        {"k": 'a"b\\c' * 4},  # 20 characters, every run between escapes short
        {"n": list(range(100)), "s": "y" * 40},
        {"deep": [[["s" * 17]]]},
    ],
)
def test_a_string_longer_than_the_limit_is_refused(value):
    with pytest.raises(encoding.StringTooLong) as caught:
        limited(orjson.dumps(value))
    assert caught.value.chars > 16


def test_a_long_run_after_the_last_string_is_no_string():
    data = b'{"a": "x", "b": [' + b",".join([b"1"] * 20) + b"]}"
    assert limited(data) == orjson.loads(data)


def test_a_short_body_is_not_scanned_for_strings(monkeypatch):
    monkeypatch.setattr(encoding, "_check_strings", lambda *a: pytest.fail("scanned"))
    assert limited(b'{"k": "abc"}', max_string_chars=12) == {"k": "abc"}


def padded(data: bytes) -> bytes:
    """The same JSON past the size below which brackets are counted out."""
    return b'{"pad": "' + b" " * encoding.SCAN_DEPTH_BELOW_BYTES + b'", "v": ' + data + b"}"


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("depth", [7, 8, 9, 30])
def test_small_and_large_bodies_meet_the_same_depth_limit(size, depth):
    # `depth` deep in all: brackets in strings, and escapes before them, are text.
    inner = b'[{"s": "]]][[[\\\\", "t": "\\"[[["}, ' + nested(depth - 2) + b"]"
    data = padded(inner) if size == "large" else b'{"v": ' + inner + b"}"
    assert (len(data) > encoding.SCAN_DEPTH_BELOW_BYTES) is (size == "large")
    if depth <= 8:
        assert limited(data, max_string_chars=1 << 20) == orjson.loads(data)
    else:
        with pytest.raises(encoding.TooDeep):
            limited(data, max_string_chars=1 << 20)
