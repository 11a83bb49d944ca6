"""Computes with torch in setup(), in the gunicorn master, before fork.

A multi-threaded forward pass before fork leaves GNU OpenMP's pool unusable in
the forked workers: they hang on their first request. serving-core caps torch
at one thread in the master, so this handler must be served normally.
"""

from __future__ import annotations

import torch

from serving_core import Handler


class ForkWarm(Handler):
    def setup(self) -> None:
        # Large enough for ATen to split the work across its OpenMP threads
        # (small tensors stay on one thread and would not show the trap).
        self.data = torch.randn(2_000_000)
        with torch.inference_mode():
            torch.nn.functional.gelu(self.data * 2).sum()

    def setup_worker(self) -> None:
        # Runs on the worker's main thread, the thread that inherited the
        # master's OpenMP state (the model thread is new and gets a fresh pool).
        with torch.inference_mode():
            torch.nn.functional.gelu(self.data * 2).sum()

    def predict_batch(self, batch: list[dict]) -> list[dict]:
        with torch.inference_mode():
            total = float(torch.nn.functional.gelu(self.data * 2).sum())
        return [{"threads": torch.get_num_threads(), "sum": total} for _ in batch]
