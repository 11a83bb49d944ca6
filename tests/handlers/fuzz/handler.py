"""A handler for fuzzing: a schema with every JSON type, and a cheap, total predict.

The schema gives schemathesis something to aim at (bounds, enums, nested
objects, arrays); ``predict_batch`` summarises whatever passed validation
without ever failing, so any 5xx the fuzzer finds is the framework's.
"""

from __future__ import annotations

from typing import Any

from serving_core import Handler


class Fuzz(Handler):
    name = "fuzz"
    version = "1"
    input_schema = {
        "type": "object",
        "required": ["text"],
        "properties": {
            "text": {"type": "string", "maxLength": 2000},
            "n": {"type": "integer", "minimum": 0, "maximum": 1000},
            "scale": {"type": "number"},
            "mode": {"enum": ["fast", "full"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
            "options": {
                "type": "object",
                "properties": {"lower": {"type": "boolean"}, "limit": {"type": "integer"}},
            },
        },
    }

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {
                "length": len(item["text"]),
                "keys": sorted(item),
                "tags": len(item.get("tags", [])),
            }
            for item in batch
        ]
