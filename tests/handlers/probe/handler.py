"""A handler for tests: tells which batch and process served a request, and misbehaves on demand.

Parameters: ``text`` (echoed), ``sleep_s`` (the batch sleeps that long),
``bad`` (raise InvalidInput for this item), ``fail`` (raise RuntimeError for
the batch), ``nan`` (return a NaN), ``report`` (return the ids seen so far),
``gate`` (a folder: the batch touches ``started`` in it, then holds the model
thread until ``open`` exists there, so a test, not the clock, decides when the
batch ends).
With PROBE_SEEN_FILE set, the ids seen are also appended to that file.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from serving_core import Handler, InvalidInput


class Probe(Handler):
    name = "probe"
    version = "7"
    input_schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "n": {"type": "integer", "minimum": 0},
            "sleep_s": {"type": "number", "maximum": 30},
            "gate": {"type": "string"},
        },
    }

    def setup(self) -> None:
        self.seen: list[str] = []
        self.setup_pid = os.getpid()
        logging.getLogger("probe").warning("probe setup in pid %d", self.setup_pid)

    def setup_worker(self) -> None:
        self.worker_pid = os.getpid()

    def preprocess(self, params: dict) -> dict:
        if params.get("early"):
            raise InvalidInput("refused in preprocess")
        return params

    def predict_batch(self, batch: list[dict]) -> list[dict]:
        if any(p.get("fail") for p in batch):
            raise RuntimeError("the probe was asked to fail")
        if any(p.get("bad") for p in batch):
            raise InvalidInput("this item is bad")
        for gate in {p["gate"] for p in batch if p.get("gate")}:
            hold(Path(gate))
        time.sleep(max((float(p.get("sleep_s", 0)) for p in batch), default=0))
        self.seen.extend(str(p.get("id", "")) for p in batch)
        seen_file = os.environ.get("PROBE_SEEN_FILE")
        if seen_file:
            with open(seen_file, "a") as f:
                f.writelines(f"{p.get('id', '')}\n" for p in batch)
        outputs = []
        for p in batch:
            if p.get("report"):
                outputs.append({"seen": list(self.seen)})
            elif p.get("nan"):
                outputs.append({"value": float("nan")})
            else:
                outputs.append(
                    {
                        "text": p.get("text"),
                        "batch_size": len(batch),
                        "pid": os.getpid(),
                        "setup_pid": self.setup_pid,
                    }
                )
        return outputs

    def postprocess(self, output: dict, params: dict) -> dict:
        if params.get("late_bad"):
            raise InvalidInput("refused in postprocess")
        return output


def hold(gate: Path) -> None:
    # Files: the one thing the test process and this worker's model thread both see.
    (gate / "started").touch()
    while not (gate / "open").exists():
        time.sleep(0.01)
