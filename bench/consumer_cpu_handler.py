"""``bench/consumer_cpu.py``'s model: batched like MiniLM, answering as it does (384
float32s an item), at next to no cost of its own, so a worker's CPU is the framework's."""

from __future__ import annotations

from typing import Any

import numpy as np

from serving_core import Handler

ROW = np.linspace(-1.0, 1.0, 384, dtype=np.float32)


class Embedding(Handler):
    name = "embedding"

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"embedding": ROW} for _ in batch]
