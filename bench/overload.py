"""Open-loop overload: requests at a fixed rate, whatever the server answers.

A closed-loop load (wrk) slows down with the server and never overloads it
for long; this one sends at ``--times`` x the measured capacity, so the queue
would grow without bound but for admission control. It reports the goodput,
how many requests were refused and how fast (the goal: a 503 within 10 ms of
arrival), how many were answered within their deadline, and the 504s.

    .venv/bin/python bench/overload.py [--times 2] [--seconds 20] [--timeout-s 2]
        [--policy adaptive] [--connections 1500] [--rounds 3] [--env SERVING_X=Y ...]
    .venv/bin/python bench/overload.py --times 0.5 1 2 4 --policy adaptive fixed
    .venv/bin/python bench/overload.py --plot-only bench/figures/overload.json

Several --times and --policy values run each pair in turn (one server per
policy). The rows go to bench/figures/overload.json and the chart (latency
percentiles and goodput against the offered rate, the bare limit as a line)
to bench/figures/overload-latency.png (``bench/plots.py``); ``--plot-only``
redraws it without measuring.

The limit (``bare_model.Bare``): a selection pass picks the best of the six
cells once; its figures are printed, never divided by, since the best of six
noisy cells is biased upward. Each round then measures that cell afresh right
before and right after itself and divides its goodput by the mean of the two,
as ``served.py`` does. The server cannot be stopped mid-round to measure, as
``jobs.py`` stops its worker (``interleave.py``): the open loop would count the
pause as late answers. The last line gives the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import openloop, plots  # noqa: E402
from bench.bare_model import Bare, Cell  # noqa: E402
from bench.served import wrk  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402


def open_loop(
    url: str, rate: float, seconds: float, max_connections: int
) -> tuple[list[tuple[int, float]], int]:
    """(status, latency from when it was due) of each request, and the stale connections."""
    bodies = [f'{{"text": "{s}"}}'.encode() for s in SENTENCES]
    load = openloop.run(url, [(rate, seconds)], bodies, max_connections=max_connections)
    results, stale = asyncio.run(load)
    return [(status, latency) for _, status, _, latency, _ in results], stale


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def one_round(url: str, times: float, args: argparse.Namespace) -> dict[str, Any]:
    """One round's figures; the caller adds the limit and the goodput's ratio to it."""
    capacity = wrk(url, 32, 8)["ok_per_s"]
    rate = times * capacity
    cpu_before, wall_before = time.process_time(), time.monotonic()
    results, stale = open_loop(url, rate, args.seconds, args.connections)
    client_cores = (time.process_time() - cpu_before) / (time.monotonic() - wall_before)
    ok = [t for s, t in results if s == 200]
    refused = [t for s, t in results if s == 503]
    n = max(1, len(results))
    return {
        "capacity": capacity,
        "rate": rate,
        "ok_per_s": len(ok) / args.seconds,
        "ok_p50_ms": percentile(ok, 50) * 1000,
        "ok_p99_ms": percentile(ok, 99) * 1000,
        "within_deadline": sum(t <= args.timeout_s for t in ok) / max(1, len(ok)),
        "refused": len(refused) / n,
        "refused_p50_ms": percentile(refused, 50) * 1000,
        "refused_p99_ms": percentile(refused, 99) * 1000,
        "refused_within_10ms": sum(t <= 0.010 for t in refused) / max(1, len(refused)),
        "late": sum(s == 504 for s, _ in results) / n,
        "other": sum(s not in (200, 503, 504) for s, _ in results),
        "stale": stale,
        "client_cores": client_cores,
    }


CELL_S = 3.0  # seconds a measurement of one bare-model cell runs

COLUMNS = [
    # key, header, format
    ("limit", "limit/s", "{:8.1f}"),
    ("capacity", "c=32/s", "{:7.1f}"),
    ("rate", "offered", "{:7.1f}"),
    ("ok_per_s", "200/s", "{:6.1f}"),
    ("ratio", "/limit", "{:6.2f}"),
    ("ok_p50_ms", "p50", "{:6.0f}"),
    ("ok_p99_ms", "p99", "{:6.0f}"),
    ("within_deadline", "in-dl", "{:7.2%}"),
    ("refused", "503", "{:6.1%}"),
    ("refused_p50_ms", "503p50", "{:6.1f}"),
    ("refused_p99_ms", "503p99", "{:6.1f}"),
    ("refused_within_10ms", "<10ms", "{:6.1%}"),
    ("late", "504", "{:6.2%}"),
    ("other", "other", "{:5.0f}"),
    ("stale", "stale", "{:5.0f}"),
    ("client_cores", "client", "{:6.2f}"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--times", type=float, nargs="+", default=[2.0], help="offered load / capacity"
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=2.0, help="SERVING_REQUEST_TIMEOUT_S")
    parser.add_argument("--policy", nargs="+", default=["adaptive"])
    parser.add_argument("--connections", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y settings")
    parser.add_argument("--plot-only", type=Path, help="redraw the chart from this JSON; no run")
    args = parser.parse_args()
    if args.plot_only:
        print("\n".join(f"wrote {p}" for p in plots.plot_file(args.plot_only)))
        return
    rows = []
    with Bare() as bare:
        selection = bare.select(CELL_S)
        print(selection.describe(), flush=True)
        for policy in args.policy:
            env = {
                "SERVING_BATCH_POLICY": policy,
                "SERVING_REQUEST_TIMEOUT_S": str(args.timeout_s),
                **dict(item.split("=", 1) for item in args.env),
            }
            with gunicorn_server(env) as server:
                wrk(server.url, 8, 3)  # warm-up
                for times in args.times:
                    rows += _run(server.url, bare, policy, times, args, cell=selection.cell)
    saved = plots.save_rows("overload", rows)
    print("\n".join(f"wrote {p}" for p in [saved, *plots.plot_file(saved)]))


def _run(
    url: str, bare: Bare, policy: str, times: float, args: argparse.Namespace, *, cell: Cell
) -> list[dict[str, Any]]:
    print(
        f"\nopen loop at {times:g}x the closed-loop capacity (c=32, measured each round), "
        f"{args.seconds:g} s, up to {args.connections} connections, policy {policy}, "
        f"deadline {args.timeout_s:g} s"
    )
    print("round " + " ".join(f"{h:>{len(f.format(0))}}" for _, h, f in COLUMNS))
    rows = []
    for round_ in range(1, args.rounds + 1):
        # The chosen cell afresh on either side of the round: the VM's speed drifts
        # within one, and the mean weighs a drift on both sides alike.
        before = bare.measure_cell(cell, CELL_S)
        row = one_round(url, times, args)
        after = bare.measure_cell(cell, CELL_S)
        limit = (before + after) / 2
        row.update(limit=limit, limit_before=before, limit_after=after)
        row.update(ratio=row["ok_per_s"] / limit, policy=policy, times=times, round=round_)
        rows.append(row)
        print(f"{round_:>5} " + " ".join(f.format(row[k]) for k, _, f in COLUMNS), flush=True)
    print(
        "median " + " ".join(f.format(statistics.median(r[k] for r in rows)) for k, _, f in COLUMNS)
    )
    print(
        "limit/s: the chosen cell, the mean of its measurements before and after the round; "
        "200/s and /limit: answered requests (goodput); p50/p99 ms from each request's scheduled "
        "send time; in-dl: answered within the deadline; 503p50/503p99 ms and <10ms: refusals; "
        "other: failed exchanges; stale: idle keep-alive connections the server had closed, "
        "retried on a new one (never reached the app); client: cores the load generator used"
    )
    return rows


if __name__ == "__main__":
    main()
