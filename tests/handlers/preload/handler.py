"""Answers what its master did around ``setup()``, as each forked process inherited it.

serve, worker and batch each preload (``serving_core.preload``): in the master,
torch at one thread before ``setup()`` and again after it, the garbage
``setup()`` left collected, the rest frozen, and only then fork.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import torch

from serving_core import Handler

SEEN: dict[str, Any] = {"garbage_freed": False}


class Garbage:
    """A reference cycle: only a collection frees it (and so runs ``__del__``)."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        SEEN["garbage_freed"] = True


def before_fork() -> None:
    # In the master, just before each fork: what the child will inherit.
    SEEN["threads_at_fork"] = torch.get_num_threads()
    SEEN["frozen_at_fork"] = gc.get_freeze_count()


class PreloadProbe(Handler):
    def setup(self) -> None:
        SEEN["threads_in_setup"] = torch.get_num_threads()
        torch.set_num_threads(2)  # as a library may while it loads a model
        # No automatic collection from here on in the master: only an explicit
        # gc.collect() can free this cycle (a frozen one is never freed).
        gc.disable()
        Garbage()
        os.register_at_fork(before=before_fork)

    def setup_worker(self) -> None:
        gc.enable()

    def predict(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(SEEN)
