"""``serving-core batch`` with MiniLM against the bare-model limit, measured in the same run.

Writes N sentences as JSONL, picks the bare model's best cell
(``Bare.select``: one process on every core and one process per core, each at
batch 8, 16 and 32), then measures that cell alone right before the batch
command and again right after it (``Bare.measure_cell``); the ratio divides
the command's sentences/s by the mean of those two fresh figures, so that
this VM's drift over minutes counts on both sides. The selection's figures
are printed but are never the limit: the best of six noisy cells is biased
upward (whichever cell happened to read high wins), so dividing by it would
understate the ratio. Before 2026-12-02 this bench divided by that best of
six, before and after.

The batch rate is the command's own: records written over the seconds from
forking the workers to the last write (the model's load and trace before
fork are start-up, reported apart as the wall time).

    .venv/bin/python bench/batch.py [--records 10000] [--seconds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.bare_model import Bare  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402

SERVING_CORE = Path(sys.executable).parent / "serving-core"
SUMMARY = re.compile(r"batch: (\d+) records written .* in ([\d.]+) s, ([\d.]+) records/s")


def run_batch(records: int, folder: Path, extra: list[str]) -> dict[str, float]:
    source, output = folder / "in.jsonl", folder / "out.jsonl"
    with source.open("w") as file:
        for i in range(records):
            file.write(json.dumps({"id": i, "text": SENTENCES[i % len(SENTENCES)]}) + "\n")
    output.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVING_")}
    command = [str(SERVING_CORE), "batch", "--handler", str(ROOT / "handlers/minilm")]
    started = time.monotonic()
    result = subprocess.run(
        [*command, "--input", str(source), "--output", str(output), *extra],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall_s = time.monotonic() - started
    match = SUMMARY.search(result.stderr)
    if result.returncode != 0 or match is None:
        raise RuntimeError(f"serving-core batch failed ({result.returncode}):\n{result.stderr}")
    if int(match[1]) != records:
        raise RuntimeError(f"wrote {match[1]} of {records} records")
    return {"per_s": float(match[3]), "seconds": float(match[2]), "wall_s": wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="per bare-model cell")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("extra", nargs="*", help="more flags for serving-core batch (after --)")
    args = parser.parse_args()
    with Bare() as bare, tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        selection = bare.select(args.seconds)
        before = bare.measure_cell(selection.cell, args.seconds)
        batch = run_batch(args.records, Path(tmp), args.extra)
        after = bare.measure_cell(selection.cell, args.seconds)
    limit = (before + after) / 2
    result = {
        "records": args.records,
        "cores": bare.cores,
        "batch_per_s": batch["per_s"],
        "batch_seconds": batch["seconds"],
        "batch_wall_s": batch["wall_s"],
        "selection": selection.to_json(),
        "limit_before_per_s": before,
        "limit_after_per_s": after,
        "limit_per_s": limit,
        "ratio": batch["per_s"] / limit,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"serving-core batch, MiniLM, {args.records} sentences, {bare.cores} usable cores")
    print(selection.describe())
    print(
        f"bare-model limit  {limit:8.1f} sentences/s  ({selection.cell}, measured afresh: "
        f"before {before:.1f}, after {after:.1f})"
    )
    print(
        f"batch command     {batch['per_s']:8.1f} sentences/s  "
        f"({batch['seconds']:.1f} s; {batch['wall_s']:.1f} s with start-up)"
    )
    print(f"ratio             {result['ratio']:8.3f}  (goal >= 0.95)")


if __name__ == "__main__":
    main()
