"""The checks of one value of a ``pipeline.yaml`` (``pipeline.config``): each returns
the value, or raises what ``fail(key, message)`` makes, naming the key."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Fail = Callable[[str, str], Exception]
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_name(value: Any, key: str, example: str, fail: Fail) -> str:
    """An environment variable's name that is not one of serving-core's settings."""
    if not isinstance(value, str) or not ENV_NAME.fullmatch(value):
        raise fail(key, f"must name an environment variable, got {value!r}")
    if value.startswith("SERVING_"):
        example = example.upper().replace("-", "_").replace(".", "_")
        raise fail(key, f"{value}: SERVING_* names are serving-core's settings; use e.g. {example}")
    return value


def no_unknown(raw: dict[str, Any], known: set[str], prefix: str, fail: Fail) -> None:
    for key in raw:
        if key not in known:
            raise fail(f"{prefix}{key}", f"unknown key; the keys are {', '.join(sorted(known))}")


def text(value: Any, key: str, fail: Fail) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float) or str(value) == "":
        raise fail(key, f"must be a non-empty string, got {value!r}")
    return str(value)


def flag(value: Any, key: str, fail: Fail) -> bool:
    if not isinstance(value, bool):
        raise fail(key, f"must be true or false, got {value!r}")
    return value


def count(value: Any, key: str, fail: Fail, *, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise fail(key, f"must be a whole number >= {least}, got {value!r}")
    return value
