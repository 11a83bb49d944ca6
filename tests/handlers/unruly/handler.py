"""A handler for the recycling tests: hangs, exits, leaks or fails its warm-up on demand.

Parameters: ``text`` (echoed with the worker's pid); ``hang`` (the batch blocks
forever with the GIL released, as a wedged lock or GPU call would); ``exit``
(the batch raises SystemExit); ``leak_mb`` (keep that many MiB for good).
With UNRULY_FAIL_WARMUP naming a file that exists, the next warm-up removes it
and fails: a respawned worker that meets a loaded machine once.
"""

from __future__ import annotations

import logging
import os
import threading

from serving_core import Handler

log = logging.getLogger("unruly")


class Unruly(Handler):
    name = "unruly"

    def setup(self) -> None:
        self.kept: list[bytes] = []

    def predict_batch(self, batch: list[dict]) -> list[dict]:
        if any(p.get("warm") for p in batch):
            flag = os.environ.get("UNRULY_FAIL_WARMUP", "")
            if flag and os.path.exists(flag):
                os.remove(flag)
                raise RuntimeError("the warm-up failed once, as asked")
        if any(p.get("hang") for p in batch):
            log.warning("unruly hangs in pid %d", os.getpid())
            threading.Event().wait()  # threading is never monkey-patched: a native wait
        if any(p.get("exit") for p in batch):
            log.warning("unruly exits in pid %d", os.getpid())
            raise SystemExit(0)
        for p in batch:
            if p.get("leak_mb"):
                self.kept.append(b"\x01" * (int(p["leak_mb"]) << 20))
        return [{"text": p.get("text"), "pid": os.getpid()} for p in batch]
