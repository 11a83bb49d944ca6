"""What lending idle cores costs: torch's thread count changed between MiniLM batches.

A worker that borrows an idle peer's core calls ``torch.set_num_threads``
before its batch, and again (back to its share) before a batch with no peer
idle (``serving_core.threads``). This measures, in one process with the
MiniLM handler, batch-1 latency in rounds of four interleaved ways:

- fixed at one thread (a worker's share on 2 cores), fixed at every usable core;
- alternating: the count changed before every batch, one thread then all,
  each batch timed with its change (the worst case: a change every batch);
- the ``set_num_threads`` call alone, both ways.

    .venv/bin/python bench/lending.py [--batches 200] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.workload import SENTENCES  # noqa: E402
from serving_core.cores import usable_cores  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200, help="batches per way per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch

    from serving_core.loading import load_handler

    cores = usable_cores()
    torch.set_num_threads(1)
    handler = load_handler(str(ROOT / "handlers/minilm/handler.py")).handler
    handler.setup()
    items = [[{"text": sentence}] for sentence in SENTENCES]
    for threads in (cores, 1):
        torch.set_num_threads(threads)
        for item in items[:20]:
            handler.predict_batch(item)  # warm-up, both ways

    def fixed(threads: int) -> list[float]:
        torch.set_num_threads(threads)
        times = []
        for i in range(args.batches):
            started = time.perf_counter()
            handler.predict_batch(items[i % len(items)])
            times.append(time.perf_counter() - started)
        return times

    def alternating() -> tuple[list[float], list[float], list[float], list[float]]:
        one, many, to_one, to_many = [], [], [], []
        for i in range(args.batches):
            threads = 1 if i % 2 == 0 else cores
            started = time.perf_counter()
            torch.set_num_threads(threads)
            switched = time.perf_counter()
            handler.predict_batch(items[i % len(items)])
            done = time.perf_counter()
            (one if threads == 1 else many).append(done - started)
            (to_one if threads == 1 else to_many).append(switched - started)
        return one, many, to_one, to_many

    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, times in (
            ("fixed 1 thread", fixed(1)),
            (f"fixed {cores} threads", fixed(cores)),
            *zip(
                (
                    "alternating, the 1-thread batches",
                    f"alternating, the {cores}-thread batches",
                    f"set_num_threads({cores} -> 1) alone",
                    f"set_num_threads(1 -> {cores}) alone",
                ),
                alternating(),
                strict=True,
            ),
        ):
            rows.setdefault(name, []).extend(times)
    summary = {
        name: {
            "p50_ms": statistics.median(times) * 1000,
            "p99_ms": statistics.quantiles(times, n=100)[98] * 1000,
        }
        for name, times in rows.items()
    }
    if args.json:
        print(json.dumps({"cores": cores, "rows": summary}, indent=2))
        return
    print(f"MiniLM batch 1, {args.rounds} rounds x {args.batches} batches, {cores} usable cores")
    for name, figures in summary.items():
        print(f"  {name:<40} p50 {figures['p50_ms']:8.3f} ms   p99 {figures['p99_ms']:8.3f} ms")


if __name__ == "__main__":
    main()
