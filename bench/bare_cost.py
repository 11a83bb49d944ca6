"""The bare model's CPU per item, at each batch size: what ``framework_cost.py`` subtracts.

The handler's ``setup()`` once, then its ``predict_batch`` (or, for a handler
that only writes ``predict``, that per item, as the engine calls it) over
batches of the workload's sentences, in this one process, for about
``--seconds`` of CPU at each size; prints one JSON object:
``{"per_item_us": {size: CPU µs per item}, "max_batch_size": N, "name": ...}``, where N is
the batch size an unbatched handler runs at (1) or the default
``SERVING_MAX_BATCH_SIZE``. CPU is ``time.process_time()``: every thread of
the process, as the served side's is read from /proc. One torch thread, as a
served worker's model has.

It imports nothing from ``bench`` or ``tests``, only ``serving_core`` (whichever
``PYTHONPATH`` names first): ``framework_cost.py --tree`` runs it against an
older tree's code.

    python bench/bare_cost.py HANDLER [--sizes 1 2 4 8 16 32] [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(1, str(Path(__file__).resolve().parent))  # workload.py, beside this file

from workload import SENTENCES

from serving_core.handler import Handler
from serving_core.loading import load_handler


def per_item_us(handler: Handler, size: int, seconds: float) -> float:
    batched = type(handler).predict_batch is not Handler.predict_batch
    batches = [
        [{"text": f"{SENTENCES[(i + j) % len(SENTENCES)]} ({i + j})"} for j in range(size)]
        for i in range(0, 64 * size, size)
    ]
    done, i = 0, 0
    started = time.process_time()
    while time.process_time() - started < seconds or done < 4 * size:
        batch = batches[i % len(batches)]
        if batched:
            handler.predict_batch(batch)
        else:
            for item in batch:
                handler.predict(item)
        done += size
        i += 1
    return (time.process_time() - started) / done * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("handler")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--seconds", type=float, default=0.5, help="CPU seconds per size")
    args = parser.parse_args()
    handler = load_handler(args.handler).handler
    handler.setup()
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    batched = type(handler).predict_batch is not Handler.predict_batch
    max_batch = 1
    if batched:
        from serving_core.settings import Settings

        max_batch = Settings.from_env({}).max_batch_size
    per_item_us(handler, max(args.sizes), args.seconds / 4)  # warm-up
    result: dict[str, Any] = {
        "per_item_us": {size: per_item_us(handler, size, args.seconds) for size in args.sizes},
        "max_batch_size": max_batch,
        # The queue a worker consumes (serving_core.handler.handler_name, not imported:
        # an older tree may not have it).
        "name": handler.name or type(handler).__name__.lower(),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
