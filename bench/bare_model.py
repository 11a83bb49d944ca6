"""The bare-model limit: MiniLM sentences/s with no server at all.

Runs the MiniLM handler's ``predict_batch`` (tokenise, forward, pool,
normalise, to rows) in a loop, two ways:

- one process whose torch uses every usable core;
- one single-threaded process per core, side by side (their sum).

The limit is the better of the two at its best batch size.

The measuring processes load the model once and stay up (``Bare``), so that a
benchmark can measure the limit again right before each served measurement:
this VM's speed drifts by ±10% over minutes, and a ratio is only honest when
both sides of it were measured under the same conditions.

The yardstick a benchmark divides by (issue 27 item 5): ``Bare.select`` runs
the six cells (both layouts at batch 8, 16, 32) once and names the best
``Cell``; ``Bare.measure_cell`` then measures that cell alone, afresh, around
each run judged, and only those fresh figures are the limit. The best of six
noisy cells is biased upward (it picks whichever cell happened to read high),
so a limit taken as that maximum flatters the limit and understates the ratio;
a second, independent measurement of the chosen cell is not. ``Bare.measure``
(the best of six as ``limit_per_s``) is kept for the benchmarks not moved yet.

    .venv/bin/python bench/bare_model.py [--seconds 3] [--rounds 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.workload import SENTENCES  # noqa: E402
from serving_core.cores import usable_cores  # noqa: E402

BATCH_SIZES = [1, 2, 4, 8, 16, 32]
LIMIT_SIZES = [8, 16, 32]  # where the best batch size has always been; 1..4 are far below
LAYOUTS = {"one_process": "1 process x all cores", "process_per_core": "1 process per core"}


@dataclass(frozen=True)
class Cell:
    """One way to run the bare model: a layout (a key of ``LAYOUTS``) and a batch size."""

    layout: str
    batch_size: int

    def __str__(self) -> str:
        return f"{LAYOUTS[self.layout]}, batch {self.batch_size}"


@dataclass(frozen=True)
class Selection:
    """The selection pass: every cell's sentences/s and the best of them. Its figures are
    for printing; the best one reads high (the maximum of noisy cells), so never divide by
    it: measure ``cell`` again (``Bare.measure_cell``) and divide by that."""

    cell: Cell
    per_s: dict[Cell, float]
    seconds: float

    def describe(self) -> str:
        """One line: each layout's figures by batch size, and the cell chosen."""
        sizes = sorted({c.batch_size for c in self.per_s})
        layouts = "; ".join(
            f"{label} " + " / ".join(f"{self.per_s[Cell(layout, b)]:.1f}" for b in sizes)
            for layout, label in LAYOUTS.items()
        )
        return (
            f"selection ({self.seconds:g} s a cell, batch {' / '.join(map(str, sizes))}): "
            f"{layouts} /s; chose {self.cell} "
            f"({self.per_s[self.cell]:.1f}/s, biased high, not the limit)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": self.cell.layout,
            "batch_size": self.cell.batch_size,
            "seconds": self.seconds,
            "cells": [
                {"layout": c.layout, "batch_size": c.batch_size, "per_s": v}
                for c, v in self.per_s.items()
            ],
        }


def serve_commands(threads: int) -> None:
    """The measuring process: load once, then run each ``{"sizes", "seconds", "start_at"}``
    read from stdin and answer ``{size: items done}`` on stdout."""
    import torch

    from serving_core.loading import load_handler

    torch.set_num_threads(threads)
    handler = load_handler(str(ROOT / "handlers/minilm/handler.py")).handler
    handler.setup()
    batches = {
        b: [
            [{"text": SENTENCES[(i + j) % len(SENTENCES)]} for j in range(b)]
            for i in range(0, len(SENTENCES), b)
        ]
        for b in BATCH_SIZES
    }
    for b in BATCH_SIZES:
        handler.predict_batch(batches[b][0])  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        seconds = command["seconds"]
        counts = {}
        for slot, b in enumerate(command["sizes"]):
            # A slot fixed in wall-clock time, so that side-by-side processes measure together.
            time.sleep(max(0.0, command["start_at"] + slot * (seconds + 0.5) - time.time()))
            done, i = 0, 0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                handler.predict_batch(batches[b][i % len(batches[b])])
                done += b
                i += 1
            counts[b] = done
        print(json.dumps(counts), flush=True)


class Bare:
    """Persistent measuring processes: one per core (one torch thread each), and one
    process with a torch thread per core."""

    def __init__(self) -> None:
        self.cores = usable_cores()
        self.per_core = [self._spawn(1) for _ in range(self.cores)]
        self.all_cores = self._spawn(self.cores)
        for proc in [*self.per_core, self.all_cores]:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"a bare-model process failed to start: {line!r}")

    @staticmethod
    def _spawn(threads: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, __file__, "--serve", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def close(self) -> None:
        for proc in [*self.per_core, self.all_cores]:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(30)

    def __enter__(self) -> Bare:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(
        self, procs: list[subprocess.Popen[str]], sizes: list[int], seconds: float
    ) -> dict[int, float]:
        """Sentences/s per batch size, summed over ``procs`` running side by side."""
        command = json.dumps({"sizes": sizes, "seconds": seconds, "start_at": time.time() + 0.2})
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            assert proc.stdout is not None
            outputs.append(json.loads(proc.stdout.readline()))
        return {b: sum(o[str(b)] for o in outputs) / seconds for b in sizes}

    def measure(self, seconds: float, sizes: list[int] = LIMIT_SIZES) -> dict[str, Any]:
        per_core = self._run(self.per_core, sizes, seconds)
        one = self._run([self.all_cores], sizes, seconds)
        return {
            "cores": self.cores,
            "rows": [
                {"batch_size": b, "one_process": one[b], "process_per_core": per_core[b]}
                for b in sizes
            ],
            "best_one_process": max(one.values()),
            "best_process_per_core": max(per_core.values()),
            "limit_per_s": max(*one.values(), *per_core.values()),
        }

    def select(self, seconds: float, sizes: list[int] = LIMIT_SIZES) -> Selection:
        """The selection pass: every layout at every size in ``sizes``, and the best cell."""
        rows = self.measure(seconds, sizes)["rows"]
        per_s = {Cell(layout, row["batch_size"]): row[layout] for row in rows for layout in LAYOUTS}
        return Selection(max(per_s, key=per_s.__getitem__), per_s, seconds)

    def measure_cell(self, cell: Cell, seconds: float) -> float:
        """Sentences/s of ``cell`` alone, measured now (the per-core layout summed over its
        processes running side by side)."""
        procs = self.per_core if cell.layout == "process_per_core" else [self.all_cores]
        return self._run(procs, [cell.batch_size], seconds)[cell.batch_size]

    def batch1_ms(self, seconds: float) -> dict[str, float]:
        """A lone request's model time: on one torch thread (a served worker's) and on all."""
        one_thread = self._run(self.per_core[:1], [1], seconds)[1]
        all_threads = self._run([self.all_cores], [1], seconds)[1]
        return {"one_thread": 1000.0 / one_thread, "all_cores": 1000.0 / all_threads}


def measure(seconds: float) -> dict[str, Any]:
    """The limit over every batch size, and the batch-1 latencies (one round)."""
    with Bare() as bare:
        result = bare.measure(seconds, BATCH_SIZES)
        latency = bare.batch1_ms(seconds)
    result["batch1_ms"] = latency["all_cores"]
    result["batch1_ms_one_thread"] = latency["one_thread"]
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve_commands(int(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=1, help="repeat; print each and the median")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args()
    results = []
    with Bare() as bare:
        for _ in range(args.rounds):
            result = bare.measure(args.seconds, BATCH_SIZES)
            result.update({f"batch1_ms_{k}": v for k, v in bare.batch1_ms(args.seconds).items()})
            results.append(result)
    if args.json:
        print(json.dumps(results if args.rounds > 1 else results[0]))
        return
    print(f"bare model, {results[0]['cores']} usable cores, {args.seconds:.0f} s per cell")
    for n, result in enumerate(results, 1):
        print(f"round {n}")
        print(f"{'batch':>5}  {'1 process x all cores':>22}  {'1 process per core':>19}")
        for row in result["rows"]:
            print(
                f"{row['batch_size']:>5}  {row['one_process']:>18.1f} /s  "
                f"{row['process_per_core']:>15.1f} /s"
            )
        print(
            f"limit {result['limit_per_s']:.1f} /s; batch-1 latency "
            f"{result['batch1_ms_all_cores']:.2f} ms on all cores, "
            f"{result['batch1_ms_one_thread']:.2f} ms on one thread"
        )
    if len(results) > 1:
        print(f"median limit: {statistics.median(r['limit_per_s'] for r in results):.1f} /s")


if __name__ == "__main__":
    main()
