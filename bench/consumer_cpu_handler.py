"""``bench/consumer_cpu.py``'s model: batched like MiniLM, answering as it does (384
float32s an item), at next to no cost of its own, so a worker's CPU is the framework's;
and ``Accelerator``, the same behind a batch's time off the CPU."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from serving_core import Handler

ROW = np.linspace(-1.0, 1.0, 384, dtype=np.float32)


class Embedding(Handler):
    name = "embedding"

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"embedding": ROW} for _ in batch]


class Accelerator(Embedding):
    """A model whose batch runs off the CPU, as a GPU's forward does: it sleeps
    ``BENCH_BATCH_MS`` (20 by default) a batch, GIL released, and answers as ``Embedding``.
    A consumer that keeps it busy serves SERVING_MAX_BATCH_SIZE items every that many
    ms per consumer; whatever the consumer does between batches, not beside them, shows
    as msg/s below that."""

    name = "accelerator"
    batch_s = float(os.environ.get("BENCH_BATCH_MS", "20")) / 1000

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        time.sleep(self.batch_s)
        return super().predict_batch(batch)
