"""The generating test handler with its test knobs in its schema, for the V2 fronts,
which take only the inputs a schema names (the fuzz tests leave the knobs out)."""

from __future__ import annotations

from handler import Generating  # the folder is on sys.path: loading puts it there


class Knobs(Generating):
    input_schema = {
        "type": "object",
        "properties": {
            **Generating.input_schema["properties"],
            "fail_at": {"type": "integer"},
            "step_s": {"type": "number", "minimum": 0, "maximum": 1},
        },
    }
