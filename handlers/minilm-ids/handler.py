"""all-MiniLM-L6-v2 on token ids: the "pred" half of the prep→pred pattern.

Input ``{"input_ids": [101, ..., 102]}`` (from ``handlers/minilm-prep``);
output ``{"embedding": [384 floats]}``, computed by handlers/minilm's own code
(imported, not copied), so the pair answers as that handler does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# handlers/ on the path, to reuse handlers/minilm's code rather than copy it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilm.handler import MAX_TOKENS, Embedder


class EmbedIds(Embedder):
    name = "all-minilm-l6-v2-ids"
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {
            "input_ids": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "minItems": 1,
                "maxItems": MAX_TOKENS,
            }
        },
        "required": ["input_ids"],
    }

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        padded = self.tokenizer.pad(
            {"input_ids": [params["input_ids"] for params in batch]}, return_tensors="pt"
        )
        return self.embed(padded["input_ids"], padded["attention_mask"])
