"""all-MiniLM-L6-v2 on token ids: the "pred" half of the prep→pred pattern.

Input ``{"input_ids": [101, ..., 102], "attention_mask": [1, ..., 1]}`` (from
``handlers/minilm-prep``; without a mask every id counts); output
``{"embedding": [384 floats]}``, computed by handlers/minilm's own code
(imported, not copied), so the pair answers as that handler does. Its V2 tensors
are declared: ``input_ids`` and ``attention_mask`` INT64 of shape [-1] a row,
``embedding`` FP32 [384] a row, which is what the prep→pred pipeline sends over
gRPC (``handlers/minilm-prep-pred``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# handlers/ on the path, to reuse handlers/minilm's code rather than copy it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilm.handler import MAX_TOKENS, Embedder

from serving_core import InvalidInput, Tensor, Tensors

_TOKENS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0},
    "minItems": 1,
    "maxItems": MAX_TOKENS,
}


class EmbedIds(Embedder):
    name = "all-minilm-l6-v2-ids"
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {
            "input_ids": _TOKENS,
            "attention_mask": {**_TOKENS, "items": {"type": "integer", "enum": [0, 1]}},
        },
        "required": ["input_ids"],
    }
    tensors = Tensors(
        inputs=(
            Tensor("input_ids", "INT64", (-1,)),
            Tensor("attention_mask", "INT64", (-1,)),
        ),
        outputs=(Tensor("embedding", "FP32", (384,)),),
    )

    def preprocess(self, params: dict[str, Any]) -> Any:
        # Ids arrive tokenised: not Embedder's tokenising preprocess (off the CPU).
        return params

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        masks = [params.get("attention_mask") or [1] * len(params["input_ids"]) for params in batch]
        if any(len(m) != len(p["input_ids"]) for m, p in zip(masks, batch, strict=True)):
            # Raised from predict_batch: serving-core finds the row and answers it 400.
            raise InvalidInput("attention_mask must have one entry per input id")
        padded = self.tokenizer.pad(
            {"input_ids": [params["input_ids"] for params in batch], "attention_mask": masks},
            return_tensors="pt",
        )
        return self.embed(padded["input_ids"], padded["attention_mask"])
