"""The bare-model limit: MiniLM sentences/s with no server at all.

Runs the MiniLM handler's ``predict_batch`` (tokenise, forward, pool,
normalise, to lists) in a loop over batch sizes, two ways:

- one process whose torch uses every usable core;
- one single-threaded process per core, side by side (their sum).

The limit is the better of the two at its best batch size. ``served.py``
divides the served throughput by it.

    .venv/bin/python bench/bare_model.py [--seconds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.workload import SENTENCES  # noqa: E402
from serving_core.resources import usable_cores  # noqa: E402

BATCH_SIZES = [1, 2, 4, 8, 16, 32]


def run_worker(threads: int, seconds: float, start_at: float, sizes: list[int]) -> dict[int, int]:
    """For each batch size, embed for ``seconds`` in a slot fixed in wall-clock time
    (so that side-by-side processes measure together); return sentences per size."""
    import torch

    from serving_core.loading import load_handler

    torch.set_num_threads(threads)
    handler = load_handler(str(ROOT / "handlers/minilm/handler.py")).handler
    handler.setup()
    counts = {}
    for slot, batch_size in enumerate(sizes):
        batches = [
            [{"text": SENTENCES[(i + j) % len(SENTENCES)]} for j in range(batch_size)]
            for i in range(0, len(SENTENCES), batch_size)
        ]
        handler.predict_batch(batches[0])  # warm-up
        time.sleep(max(0.0, start_at + slot * (seconds + 1.0) - time.time()))
        done, i = 0, 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            handler.predict_batch(batches[i % len(batches)])
            done += batch_size
            i += 1
        counts[batch_size] = done
    return counts


def side_by_side(
    processes: int, threads: int, seconds: float, sizes: list[int] = BATCH_SIZES
) -> dict[int, float]:
    """Sentences/s per batch size, summed over ``processes`` running at once."""
    start_at = time.time() + 15.0  # time for every process to load the model
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                str(threads),
                str(seconds),
                str(start_at),
                ",".join(map(str, sizes)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    outputs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    return {b: sum(o[str(b)] for o in outputs) / seconds for b in sizes}


def measure(seconds: float) -> dict[str, Any]:
    cores = usable_cores()
    one = side_by_side(1, cores, seconds)
    per_core = side_by_side(cores, 1, seconds)
    # What one request alone costs in a served worker: one process, one torch thread.
    single = side_by_side(1, 1, seconds, [1])
    rows = [
        {"batch_size": b, "one_process": one[b], "process_per_core": per_core[b]}
        for b in BATCH_SIZES
    ]
    return {
        "cores": cores,
        "rows": rows,
        "best_one_process": max(one.values()),
        "best_process_per_core": max(per_core.values()),
        "batch1_ms": 1000.0 / one[1] if one[1] else None,
        "batch1_ms_one_thread": 1000.0 / single[1] if single[1] else None,
        "limit_per_s": max(*one.values(), *per_core.values()),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        threads, seconds, start_at, sizes = sys.argv[2:6]
        counts = run_worker(
            int(threads), float(seconds), float(start_at), [int(b) for b in sizes.split(",")]
        )
        print(json.dumps(counts))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args()
    result = measure(args.seconds)
    if args.json:
        print(json.dumps(result))
        return
    print(f"bare model, {result['cores']} usable cores, {args.seconds:.0f} s per cell")
    print(f"{'batch':>5}  {'1 process x all cores':>22}  {'1 process per core':>19}")
    for row in result["rows"]:
        print(
            f"{row['batch_size']:>5}  {row['one_process']:>18.1f} /s  "
            f"{row['process_per_core']:>15.1f} /s"
        )
    print(f"best, 1 process x all cores: {result['best_one_process']:.1f} /s")
    print(f"best, 1 process per core:    {result['best_process_per_core']:.1f} /s")
    print(f"batch-1 latency, all cores:  {result['batch1_ms']:.2f} ms")
    print(f"batch-1 latency, one thread: {result['batch1_ms_one_thread']:.2f} ms")
    print(f"limit: {result['limit_per_s']:.1f} sentences/s")


if __name__ == "__main__":
    main()
