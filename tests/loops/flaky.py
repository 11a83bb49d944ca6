"""The loops' tests' handler: a model that fails on cue."""

from __future__ import annotations

from typing import Any

from serving_core import Handler


class Flaky(Handler):
    """Fails every batch that holds a ``poison`` item, and the first run of ``flaky`` ones."""

    name = "flaky"

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.failed_once: set[int] = set()

    def predict_batch(self, items: list[Any]) -> list[Any]:
        self.batches.append([item["n"] for item in items])
        if any(item.get("poison") for item in items):
            raise RuntimeError("poisoned")
        for item in items:
            if item.get("flaky") and item["n"] not in self.failed_once:
                self.failed_once.add(item["n"])
                raise RuntimeError("flaky")
        return [{"double": 2 * item["n"]} for item in items]
