"""Fields redacted by name before an event leaves the worker.

A field whose name (any case) is redacted has its value replaced by
``[redacted]`` wherever it is: at the top of the parameters or the answer, or
in a dict nested in dicts and lists at any depth. API keys travel in headers,
which are never logged; the names in ``DEFAULT`` are redacted as well, in case
a client also put one in the body.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

REDACTED = "[redacted]"
DEFAULT = ("api_key", "apikey", "authorization", "password", "token")


class Redaction:
    """``redaction(value)``: a copy of ``value`` with the named fields' values replaced;
    what holds none of them is returned as it is, uncopied."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = frozenset(name.lower() for name in (*DEFAULT, *names))

    def __call__(self, value: Any) -> Any:
        if isinstance(value, dict):
            return self._dict(value)
        if isinstance(value, (list, tuple)):
            items = [self(item) for item in value]
            if all(new is old for new, old in zip(items, value, strict=True)):
                return value
            return items
        return value

    def _dict(self, value: dict[Any, Any]) -> dict[Any, Any]:
        changed = False
        copy: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and key.lower() in self.names:
                new: Any = REDACTED
            else:
                new = self(item)
            changed = changed or new is not item
            copy[key] = new
        return copy if changed else value
