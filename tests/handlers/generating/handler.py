"""A text generator for the tests: continuous batching (``step``) with its own record.

Each request generates ``n`` words (`` w0``, `` w1``, ...; 8 by default), or
words of its prompt in turn. Every step appends a line to the record file
named by ``GENERATING_RECORD`` (when set): the step's request ids, so a test
reads who shared which step. ``gate``: a file path; the generation waits after
its first chunk until that file exists, so a test can show the first chunk
arrived before the generation ended. ``fail_at``: the step at which this
request's generation breaks (an exception, failing the step); ``bad_at``: the
step at which it alone gets an ``InvalidInput``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from serving_core import Final, Generation, Handler, InvalidInput, TextGeneration
from serving_core.context import batch

GATE_WAIT_S = 60.0


class Generating(Handler):
    name = "generating"
    cacheable = False
    text = TextGeneration()
    # The test knobs (gate, fail_at, bad_at, step_s) stay out of the schema, which
    # the fuzz tests generate requests from: a fuzzed fail_at is a model failing
    # on purpose, a fuzzed gate a generation waiting a minute.
    input_schema = {
        "type": "object",
        "properties": {
            "prompt": {"type": "string"},
            "n": {"type": "integer", "minimum": 1, "maximum": 1000},
            "max_tokens": {"type": "integer"},
        },
    }

    def setup(self) -> None:
        self.record = os.environ.get("GENERATING_RECORD", "")

    def step(self, generations: list[Generation]) -> list[Any]:
        ids = [ctx.request_id for ctx in batch()]
        if self.record:
            with open(self.record, "a") as out:
                out.write(json.dumps({"pid": os.getpid(), "ids": ids}) + "\n")
        pause = max((g.item.get("step_s", 0.0) for g in generations), default=0.0)
        if pause:
            time.sleep(pause)
        answers: list[Any] = []
        for g in generations:
            item = g.item
            if item.get("fail_at") == g.steps:
                raise RuntimeError("the model broke mid-stream")
            if item.get("bad_at") == g.steps:
                answers.append(InvalidInput("this request's token is bad"))
                continue
            gate = item.get("gate")
            if gate and g.steps == 1:
                waited = time.monotonic() + GATE_WAIT_S
                while not os.path.exists(gate) and time.monotonic() < waited:
                    time.sleep(0.01)
            words = item.get("prompt", "").split()
            word = words[g.steps % len(words)] if words else f"w{g.steps}"
            chunk = {"text": f" {word}"}
            answers.append(Final(chunk) if g.steps + 1 >= item.get("n", 8) else chunk)
        return answers
