"""A handler for the shared model process: says which batch, model process and worker served.

``predict_batch`` runs where the model runs (the model process, or each
worker's model thread): it numbers its batches and says its pid;
``postprocess`` runs in the worker that took the request and adds that pid.
``sleep_s`` holds the batch, so that requests pile up into one; ``down``
raises the handler's own error, ``unpicklable`` answers what pickle cannot
carry back to the worker.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

from serving_core import Handler
from serving_core.errors import BadGateway


class StageDown(BadGateway):
    """The handler's own error, with arguments of its own: it reaches the worker as raised."""

    def __init__(self, stage: str, *, attempts: int) -> None:
        super().__init__(f"stage {stage!r} is down", details={"stage": stage}, retry_after_s=3.0)
        self.stage = stage
        self.attempts = attempts


class Shared(Handler):
    name = "shared"
    version = "1"

    def setup(self) -> None:
        self.batches = itertools.count()

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        time.sleep(max((float(p.get("sleep_s", 0)) for p in batch), default=0))
        number = next(self.batches)
        for p in batch:
            if "down" in p:
                raise StageDown(p["down"], attempts=2)
        return [
            {
                "text": p.get("text"),
                "batch": number,
                "size": len(batch),
                "model_pid": os.getpid(),
                "device": self.device,
                **({"callback": lambda: None} if p.get("unpicklable") else {}),
            }
            for p in batch
        ]

    def postprocess(self, output: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        return {**output, "worker_pid": os.getpid()}
