"""A handler for the payload-logging tests: echoes ``text``, answers a ``token`` (redacted
by default) and redacts ``ssn`` by its own ``redact``; ``bad`` is refused (a 400)."""

from __future__ import annotations

from typing import Any

from serving_core import Handler, InvalidInput


class Payloads(Handler):
    name = "payloads"
    version = "3"
    redact = ("ssn",)
    input_schema = {"type": "object", "properties": {"text": {"type": "string"}}}

    def predict_batch(self, items: list[dict[str, Any]]) -> list[dict[str, Any] | InvalidInput]:
        return [
            InvalidInput("refused on purpose")
            if item.get("bad")
            else {"echo": item.get("text"), "token": "answer-token"}
            for item in items
        ]
