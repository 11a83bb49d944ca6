"""Text to all-MiniLM-L6-v2 token ids: the "prep" half of the prep→pred pattern.

No model here, only the tokenizer (handlers/minilm's own, imported from it);
``handlers/minilm-ids`` is the "pred" half and ``handlers/minilm-prep-pred``
the serial pipeline over both, which answers as ``handlers/minilm`` does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# handlers/ on the path, to reuse handlers/minilm's code rather than copy it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilm.handler import MAX_TOKENS, Embedder, load_tokenizer

from serving_core import Handler


class Tokenize(Handler):
    name = "all-minilm-l6-v2-prep"
    version = "1"
    input_schema = Embedder.input_schema

    def setup(self) -> None:
        self.tokenizer = load_tokenizer()

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Unpadded, truncated as handlers/minilm truncates: the pipeline sends the ids
        # and mask on to handlers/minilm-ids as INT64 tensors over gRPC.
        encoded = self.tokenizer(
            [params["text"] for params in batch], truncation=True, max_length=MAX_TOKENS
        )
        return [
            {"input_ids": ids, "attention_mask": mask}
            for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)
        ]
