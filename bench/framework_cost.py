"""The framework's CPU µs per item on every path: a yardstick that holds on any machine.

For each path (``/predict`` over gevent and gthread, V2 REST, V2 gRPC, ``serving-core
worker`` on SQLite and Redis, ``serving-core stream`` on Redis Streams, RabbitMQ and
Kafka (Tansu), ``serving-core batch``), the serving side's CPU per item minus the
bare model's per item at the batch size the path ran, both measured in this run.
The serving side is every process of its session (gunicorn's master and workers,
the model process if any; the worker's and stream's consumers; the batch command
and its forked workers), read from /proc (``proc_cpu.py``) right before and right
after a fixed number of items, after a warm-up. The bare model is
``bare_cost.py``: the handler's own predict in one process, per batch size,
measured before the paths and after them (the mean). The batch size is the
service's ``serving_batch_size`` histogram over the items; where a path does not
report it (gRPC, batch), the handler's largest.

``handlers/echo`` by default: a model that costs ~0.1-0.4 µs, so what is left is
the framework's. ``/predict`` also runs a bare Flask app (``cpu_path.py``'s)
on the same worker class; its goal is over that. A broker's own CPU (redis-server,
RabbitMQ, Tansu) is not the framework's: it is printed apart. The load
generators (wrk, ``grpc_load.py``, this script producing and submitting) are
outside the sessions measured. The cache is off (``SERVING_CACHE_SIZE=0``), so
every item reaches the model.

It drives only the commands, HTTP and the brokers, so it measures any tree:
``--tree DIR`` (or ``PYTHONPATH=DIR``) runs DIR's ``serving_core`` and its
handlers, e.g. an older commit's worktree, from this checkout's bench.

    .venv/bin/python bench/framework_cost.py [--rounds 1] [--paths predict-gevent grpc ...]
        [--items 4000] [--handler echo] [--tree DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.cost_paths import Context, grpc, predict, v2_rest  # noqa: E402
from bench.cost_workers import batch, jobs, stream  # noqa: E402

PATHS: dict[str, Callable[[Context], list[dict[str, Any]]]] = {
    "predict-gevent": predict("gevent"),
    "predict-gthread": predict("gthread"),
    "v2-rest": v2_rest,
    "grpc": grpc,
    "jobs-sqlite": jobs("sqlite"),
    "jobs-redis": jobs("redis"),
    "stream-redis": stream("redis"),
    "stream-amqp": stream("amqp"),
    "stream-kafka": stream("kafka"),
    "batch": batch,
}
GOALS = {"jobs": 250.0, "stream": 250.0, "grpc": 150.0, "predict": 150.0}


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in cpuinfo.splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    return {"cpu_model": model, "nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))}


def tree_of(env: dict[str, str]) -> Path:
    """Where a child process with ``env`` imports ``serving_core`` from."""
    out = subprocess.run(
        [sys.executable, "-c", "import serving_core; print(serving_core.__file__)"],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return Path(out.strip()).parent.parent


def commit_of(tree: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()[:70] or "not a git tree"


def bare(ctx: Context, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bare_cost.py"),
            ctx.handler,
            "--seconds",
            str(seconds),
        ],
        env=ctx.env({}),
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"bench/bare_cost.py failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    result["per_item_us"] = {int(k): v for k, v in result["per_item_us"].items()}
    return result


def bare_at(per_item_us: dict[int, float], batch: float) -> float:
    """The bare µs per item at a mean batch size: between the two sizes measured around it."""
    sizes = sorted(per_item_us)
    if batch <= sizes[0]:
        return per_item_us[sizes[0]]
    for low, high in itertools.pairwise(sizes):
        if batch <= high:
            share = (batch - low) / (high - low)
            return per_item_us[low] + share * (per_item_us[high] - per_item_us[low])
    return per_item_us[sizes[-1]]


def finish(row: dict[str, Any], per_item_us: dict[int, float], max_batch: int) -> None:
    """Fill a measured row's per-item figures."""
    items = row["items"]
    batch = row["batch"] or max_batch
    row["batch"] = batch
    row["worker_us"] = row["cpu_s"] / items * 1e6
    row["bare_us"] = bare_at(per_item_us, batch)
    row["framework_us"] = row["worker_us"] - row["bare_us"]
    if row.get("flask_cpu_s") is not None:
        row["flask_us"] = row["flask_cpu_s"] / row["flask_items"] * 1e6
        row["over_flask_us"] = row["framework_us"] - row["flask_us"]
    if row.get("broker_cpu_s") is not None:
        row["broker_us"] = row["broker_cpu_s"] / items * 1e6


def judged(path: str, row: dict[str, Any]) -> tuple[float | None, float | None]:
    """(the figure the goal is about, the goal) for ``path``'s row."""
    kind = path.split("-", maxsplit=1)[0]
    goal = GOALS.get(kind)
    if kind == "predict":
        return row.get("over_flask_us"), goal
    return row["framework_us"], goal


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over the rounds of each path, with the range of its framework figure."""
    out = []
    for path in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == path]
        keys = [k for k, v in mine[0].items() if isinstance(v, int | float)]
        row: dict[str, Any] = {"path": path, "rounds": len(mine)}
        row.update({k: statistics.median(r[k] for r in mine) for k in keys if k != "round"})
        row["framework_range"] = [
            min(r["framework_us"] for r in mine),
            max(r["framework_us"] for r in mine),
        ]
        row["judged_us"], row["goal_us"] = judged(path, row)
        out.append(row)
    return out


def table(summary: list[dict[str, Any]]) -> str:
    def f(value: Any, digits: int = 0) -> str:
        return "—" if value is None else f"{value:,.{digits}f}"

    lines = [
        "| path | items | batch | worker µs/item | bare µs/item | framework µs/item (range) "
        "| bare Flask µs/req | over Flask | broker µs/item | goal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in summary:
        low, high = r["framework_range"]
        spread = f" ({low:.0f}-{high:.0f})" if r["rounds"] > 1 else ""
        goal = "—"
        if r["goal_us"] is not None and r["judged_us"] is not None:
            verdict = "met" if r["judged_us"] <= r["goal_us"] else "**not met**"
            goal = f"≤ {r['goal_us']:.0f}: {verdict}"
        lines.append(
            f"| {r['path']} | {f(r['items'])} | {f(r['batch'], 1)} | {f(r['worker_us'])} "
            f"| {f(r['bare_us'], 1)} | **{f(r['framework_us'])}**{spread} "
            f"| {f(r.get('flask_us'))} | {f(r.get('over_flask_us'))} | {f(r.get('broker_us'))} "
            f"| {goal} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    parser.add_argument("--items", type=int, default=4000, help="per path per round")
    parser.add_argument("--grpc-seconds", type=float, default=5.0, help="gRPC's closed loop")
    parser.add_argument(
        "--grpc-worker-class",
        choices=["gevent", "gthread"],
        default="gevent",
        help="the gRPC path's (trees before 2026-12-02 served gRPC from gthread only)",
    )
    parser.add_argument("--connections", type=int, default=32, help="HTTP and gRPC clients")
    parser.add_argument("--handler", default="echo", help="a folder of handlers/")
    parser.add_argument("--tree", type=Path, help="the serving_core tree to measure")
    parser.add_argument("--bare-seconds", type=float, default=0.5, help="CPU s per batch size")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks stop servers
    ctx = Context(args)
    ctx.tree = tree_of(ctx.env({}))
    handler_dir = ctx.tree / "handlers" / args.handler
    ctx.handler = str(handler_dir if handler_dir.exists() else ROOT / "handlers" / args.handler)
    host = machine()
    header = (
        f"{host['cpu_model']}, nproc {host['nproc']} ({host['affinity']} usable); "
        f"tree {ctx.tree} ({commit_of(ctx.tree)}); handler {ctx.handler}; "
        f"{args.items} items a path, {args.rounds} round(s); "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    print(header, flush=True)
    before = bare(ctx, args.bare_seconds)
    ctx.name = before["name"]
    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    for path in args.paths:
        try:
            measured = PATHS[path](ctx)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            # An older tree may lack a path, or need other settings for it: the rest still run.
            failed[path] = str(exc).strip().splitlines()[-1][:200]
            print(f"  {path} failed: {exc}", flush=True)
            continue
        for row in measured:
            row["path"] = path
            rows.append(row)
            print(
                f"  {path} round {row['round']}: {row['items']} items, "
                f"{row['cpu_s']:.2f} CPU s of {row.get('processes', 1)} processes over "
                f"{row['wall_s']:.1f} s, "
                f"batch {row['batch'] or '?'}; the rest of the machine (the load, this "
                f"script, others) {row['rest_cores']:.2f} cores",
                flush=True,
            )
    after = bare(ctx, args.bare_seconds)
    per_item = {
        b: (before["per_item_us"][b] + after["per_item_us"][b]) / 2 for b in before["per_item_us"]
    }
    print(
        "bare µs/item by batch size (mean of before and after): "
        + ", ".join(f"{b}: {v:.2f}" for b, v in per_item.items())
    )
    for row in rows:
        finish(row, per_item, before["max_batch_size"])
    summary = summarise(rows)
    print(table(summary))
    for path, why in failed.items():
        print(f"{path}: not measured: {why}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "header": header,
                    "machine": host,
                    "tree": str(ctx.tree),
                    "commit": commit_of(ctx.tree),
                    "handler": ctx.handler,
                    "bare_before": before,
                    "bare_after": after,
                    "rows": rows,
                    "failed": failed,
                    "summary": summary,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
