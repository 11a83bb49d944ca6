"""Served MiniLM throughput and latency through gunicorn, as a ratio of the bare model.

Starts ``serving-core serve`` and drives it with ``wrk`` (closed loop,
keep-alive connections) at each concurrency, in rounds. The bare model's best
cell is picked once at the start (``Bare.select``: both layouts at batch 8,
16, 32; processes that loaded the model once and wait, idle, while the server
is measured); each run at a concurrency is bracketed by measurements of that cell alone
(``Bare.measure_cell``) right before and right after it, because this VM's
speed drifts by 10-20% within a minute, and their mean is that run's limit
(until 2026-12-02, only a measurement before each round). The selection's figures are
printed, never the limit: the best of six noisy cells is biased upward
(before 2026-12-02 each round's limit was that best of six). Each served
figure is divided by its own run's limit, and the summary gives the median
of those ratios. Each round also measures a lone request's model time (bare
batch 1, on one torch thread and on every core): a lone served request may use
every core (idle workers lend theirs), so c=1's p50 is compared with the better
of the two, measured in the same round.

Each run also splits its ratio in two, from the server's own batch metrics
(``serving_batch_duration_seconds``, ``serving_batch_size``) read before and
after it: ``busy``, the share of the run a worker's model thread spent in
batches (the rest went to its hub between batches, and to gaps), and
``model``, the bare time an item over the served model's: the chosen cell's
time an item on a core when the served batches were full-ish, the best bare
batch-1 latency when they held one item (c=1). At full load with a worker
per core the ratio is about ``busy x model`` (issue 27 item 4: where the
rest of c=32 goes); ``model`` below 1 is the model itself running slower in
the server than in the bare processes.

    .venv/bin/python bench/served.py [--policy adaptive fixed] [--concurrency 1 8 32]
        [--seconds 10] [--rounds 3] [--env SERVING_X=Y ...]
    .venv/bin/python bench/served.py --plot-only bench/figures/served.json

The rows go to bench/figures/served.json and the chart (throughput and
latency against concurrency, the bare limit as a line) to
bench/figures/served-throughput.png (``bench/plots.py``); ``--plot-only``
redraws the chart from a saved JSON without measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import plots  # noqa: E402
from bench.bare_model import Bare  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from serving_core.cores import usable_cores  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402

LUA = ROOT / "bench" / "post.lua"
BATCH_METRICS = (
    "serving_batch_duration_seconds_sum",
    "serving_batch_duration_seconds_count",
    "serving_batch_size_sum",
)


def batch_totals(url: str) -> tuple[float, ...]:
    """Seconds spent in batches, batches and items batched, over every worker (/metrics)."""
    sums = dict.fromkeys(BATCH_METRICS, 0.0)
    text = requests.get(f"{url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return tuple(sums.values())


def split_ratio(
    before: tuple[float, ...],
    after: tuple[float, ...],
    seconds: float,
    *,
    workers: int,
    limit: float,
    cores: int,
    batch1_ms: float,
) -> dict[str, float]:
    """``busy``: a worker's share of ``seconds`` in batches; ``model``: the bare time an
    item over the served model's time an item (wall clock, batch metrics). The bare
    time is the limit's cell on a core (``cores / limit``) when the served batches were
    full-ish, and the best bare batch-1 latency when they held one item on average
    (c=1): the two batch sizes the bare side measures."""
    batch_s, batches, items = (a - b for a, b in zip(after, before, strict=True))
    if items <= 0:
        zero = ("busy", "model", "served_item_ms", "bare_item_ms", "mean_batch")
        return dict.fromkeys(zero, 0.0)
    served_item_ms = batch_s / items * 1e3
    bare_item_ms = batch1_ms if items / batches < 2 else cores / limit * 1e3
    return {
        "busy": batch_s / workers / seconds,
        "model": bare_item_ms / served_item_ms,
        "served_item_ms": served_item_ms,
        "bare_item_ms": bare_item_ms,
        "mean_batch": items / batches,
    }


def wrk(
    url: str, connections: int, seconds: float, delay_ms: float = 0.0, v2_model: str = ""
) -> dict[str, Any]:
    """``v2_model``: the sentences as V2 REST requests to that model (post.lua says how)."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(SENTENCES))
    env = dict(os.environ, WRK_SENTENCES=f.name, WRK_DELAY_MS=str(delay_ms))
    if v2_model:
        env["WRK_V2_MODEL"] = v2_model
    threads = min(2, connections)
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{round(seconds)}s",
            "--timeout",
            "30s",
            "-s",
            str(LUA),
            url,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(f.name)
    match = re.search(r"^WRK_JSON (.*)$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    result: dict[str, Any] = json.loads(match.group(1))
    ok = result["statuses"].get("200", 0)
    result["ok_per_s"] = ok / result["duration_s"]
    result["rejected"] = result["statuses"].get("503", 0)
    result["timed_out"] = result["statuses"].get("504", 0)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", nargs="+", default=["adaptive"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y settings")
    parser.add_argument("--plot-only", type=Path, help="redraw the chart from this JSON; no run")
    args = parser.parse_args()
    if args.plot_only:
        print("\n".join(f"wrote {p}" for p in plots.plot_file(args.plot_only)))
        return
    extra = dict(item.split("=", 1) for item in args.env)
    rows: list[dict[str, Any]] = []
    with Bare() as bare:
        latency = bare.batch1_ms(3.0)
        print(
            f"bare model batch-1 latency: {latency['one_thread']:.2f} ms on one torch thread "
            f"(a served worker's), {latency['all_cores']:.2f} ms on all cores"
        )
        selection = bare.select(3.0)
        print(selection.describe())
        print(
            f"{'policy':>8} {'round':>5} {'conc':>5} {'limit/s':>8} {'ok/s':>8} {'ratio':>6} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'503':>6} {'504':>5} {'errors':>6} "
            f"{'busy':>5} {'model':>6} {'ms/item served/bare':>20}"
        )
        cores = usable_cores()
        workers = int(extra.get("SERVING_WORKERS") or cores)
        for policy in args.policy:
            env = {"SERVING_BATCH_POLICY": policy, **extra}
            with gunicorn_server(env) as server:
                wrk(server.url, 8, 3)  # warm-up: the cost model and the allocator settle
                for round_ in range(1, args.rounds + 1):
                    # The chosen cell afresh right before this round's runs: the VM drifts.
                    limit = bare.measure_cell(selection.cell, 3.0)
                    # And a lone request's model time, on one thread and on all: a
                    # lone served request runs on every core while the others idle.
                    alone = bare.batch1_ms(3.0)
                    best_ms = min(alone.values())
                    print(
                        f"round {round_}: bare batch-1 {alone['one_thread']:.2f} ms on one "
                        f"torch thread, {alone['all_cores']:.2f} ms on all cores",
                        flush=True,
                    )
                    for connections in args.concurrency:
                        totals = batch_totals(server.url)
                        row = wrk(server.url, connections, args.seconds)
                        totals_after = batch_totals(server.url)
                        # And again right after it: the limit is the mean of the
                        # measurements on either side of the run (the VM drifts within one).
                        after = bare.measure_cell(selection.cell, 3.0)
                        mean = (limit + after) / 2
                        row.update(policy=policy, round=round_, concurrency=connections)
                        row.update(limit=mean, limit_before=limit, limit_after=after)
                        row.update(ratio=row["ok_per_s"] / mean)
                        row.update(
                            split_ratio(
                                totals,
                                totals_after,
                                row["duration_s"],
                                workers=workers,
                                limit=mean,
                                cores=cores,
                                batch1_ms=best_ms,
                            )
                        )
                        limit = after  # the next run's measurement before it
                        row.update(bare_batch1_ms=alone, over_best_ms=row["p50_ms"] - best_ms)
                        rows.append(row)
                        print(
                            f"{policy:>8} {round_:>5} {connections:>5} {mean:>8.1f} "
                            f"{row['ok_per_s']:>8.1f} {row['ratio']:>6.2f} {row['p50_ms']:>8.2f} "
                            f"{row['p99_ms']:>8.2f} {row['rejected']:>6} {row['timed_out']:>5} "
                            f"{row['socket_errors']:>6} {row['busy']:>5.2f} {row['model']:>6.2f} "
                            f"{row['served_item_ms']:>11.2f}/{row['bare_item_ms']:<8.2f}",
                            flush=True,
                        )
                        time.sleep(1)
    print(f"\nmedians over {args.rounds} rounds (ratio: of each round's served/limit pair)")
    print(
        f"{'policy':>8} {'conc':>5} {'ok/s':>8} {'ratio':>6} {'range':>11} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'p50 - best bare batch-1, same round':>36} "
        f"{'busy':>5} {'model':>6}"
    )
    for policy in args.policy:
        for connections in args.concurrency:
            mine = [r for r in rows if r["policy"] == policy and r["concurrency"] == connections]
            ratios = [r["ratio"] for r in mine]
            p50 = statistics.median(r["p50_ms"] for r in mine)
            ok = statistics.median(r["ok_per_s"] for r in mine)
            print(
                f"{policy:>8} {connections:>5} {ok:>8.1f} "
                f"{statistics.median(ratios):>6.2f} {min(ratios):>5.2f}-{max(ratios):<5.2f} "
                f"{p50:>8.2f} {statistics.median(r['p99_ms'] for r in mine):>8.2f} "
                f"{statistics.median(r['over_best_ms'] for r in mine):>+36.2f} "
                f"{statistics.median(r['busy'] for r in mine):>5.2f} "
                f"{statistics.median(r['model'] for r in mine):>6.2f}"
            )
    saved = plots.save_rows("served", rows)
    print("\n".join(f"wrote {p}" for p in [saved, *plots.plot_file(saved)]))


if __name__ == "__main__":
    main()
