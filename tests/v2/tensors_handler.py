"""A handler for tests/v2 that declares its tensors (``Handler.tensors``), batched."""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from serving_core import Handler, Tensor, Tensors


class Scaler(Handler):
    name = "scaler"
    version = "3"
    input_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "values": {"type": "array", "items": {"type": "number"}},
            "label": {"type": "string"},
            "sleep_s": {"type": "number", "maximum": 5},
        },
        "required": ["values"],
    }
    tensors = Tensors(
        inputs=(
            Tensor("INPUT0", "FP32", (3,), field="values"),
            Tensor("LABEL", "BYTES", field="label"),
            Tensor("SLEEP", "FP64", field="sleep_s"),
        ),
        outputs=(
            Tensor("OUTPUT0", "FP32", (3,), field="doubled"),
            Tensor("LABEL", "BYTES", field="label"),
            Tensor("BATCH", "INT32", field="batch"),
        ),
    )

    def predict_batch(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        time.sleep(max(float(item.get("sleep_s", 0)) for item in items))
        return [
            {
                "doubled": np.asarray(item["values"], dtype=np.float32) * 2,
                "label": item.get("label", ""),
                "batch": len(items),
            }
            for item in items
        ]
