"""The fronts of one server at c=32 with MiniLM: ``/predict``, V2 REST, V2 gRPC, and
``both`` (``/predict`` and gRPC at once, half the connections each), each as a ratio
of the bare-model limit; and the same for the ONNX Runtime handler.

One ``serving-core serve`` per handler (the default worker class unless
``--worker-class``; the cache off, so every request reaches the model), driven
closed-loop at ``--concurrency`` connections: wrk for the two HTTP fronts
(post.lua, with ``WRK_V2_MODEL`` for V2), ``bench/grpc_load.py`` for gRPC (one
channel per connection). Each round runs the fronts in a rotated order, so that this VM's
drift falls on all three alike; the summary gives the median of each front's
ratios, and gRPC ÷ /predict per round.

The limit (``bare_model.Bare``, torch: the limit of handlers/minilm): a
selection pass picks the best of the six cells once; its figures are printed,
never divided by, since the best of six noisy cells is biased upward. That cell
is measured afresh before each round and after each front's run, and a run is
divided by the mean of the measurements on either side of it (as ``served.py``
does). The server is not stopped during a run to measure, as ``jobs.py`` stops
its worker (``interleave.py``): the closed-loop load would count the pause.

    .venv/bin/python bench/protocols.py [--handlers minilm minilm-onnx] [--rounds 3]
        [--seconds 10] [--concurrency 32] [--worker-class gevent|gthread]

An ONNX row's ratio is still over the torch limit: served onnx against bare
torch (bench/onnx_vs_torch.py gives the two bare limits side by side).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.bare_model import Bare  # noqa: E402
from bench.served import wrk  # noqa: E402
from tests.servers import free_port, gunicorn_server  # noqa: E402

FRONTS = ["predict", "v2-rest", "grpc", "both"]
CELL_S = 3.0  # seconds a measurement of one bare-model cell runs


def grpc_load(target: str, model: str, connections: int, seconds: float) -> dict[str, Any]:
    script = str(ROOT / "bench" / "grpc_load.py")
    out = subprocess.run(
        [sys.executable, script, target, model, str(connections), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("GRPC_JSON "))
    result: dict[str, Any] = json.loads(line.removeprefix("GRPC_JSON "))
    result["ok_per_s"] = result["statuses"].get("OK", 0) / result["duration_s"]
    result["errors"] = sum(n for code, n in result["statuses"].items() if code != "OK")
    return result


def drive(front: str, server: Any, model: str, connections: int, seconds: float) -> dict[str, Any]:
    if front == "both":
        return both(server, model, connections, seconds)
    if front == "grpc":
        return grpc_load(server.grpc, model, connections, seconds)
    row = wrk(server.url, connections, seconds, v2_model=model if front == "v2-rest" else "")
    row["errors"] = row["requests"] - row["statuses"].get("200", 0) + row["socket_errors"]
    return row


def both(server: Any, model: str, connections: int, seconds: float) -> dict[str, Any]:
    """``/predict`` and gRPC at once, half the connections each: their sum, the worse
    p50 and p99, and each front's own share (``predict_ok_per_s``, ``grpc_ok_per_s``)."""
    half = max(1, connections // 2)
    rows: dict[str, dict[str, Any]] = {}

    def run(front: str) -> None:
        rows[front] = drive(front, server, model, half, seconds)

    threads = [threading.Thread(target=run, args=(front,)) for front in ("predict", "grpc")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    http, grpc = rows["predict"], rows["grpc"]
    return {
        "ok_per_s": http["ok_per_s"] + grpc["ok_per_s"],
        "predict_ok_per_s": http["ok_per_s"],
        "grpc_ok_per_s": grpc["ok_per_s"],
        "p50_ms": max(http["p50_ms"], grpc["p50_ms"]),
        "p99_ms": max(http["p99_ms"], grpc["p99_ms"]),
        "errors": http["errors"] + grpc["errors"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handlers", nargs="+", default=["minilm", "minilm-onnx"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker-class", choices=["gevent", "gthread"], default="gevent")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with Bare() as bare:
        selection = bare.select(CELL_S)
        print(selection.describe(), flush=True)
        print(
            f"{'handler':>12} {'round':>5} {'front':>8} {'limit/s':>8} {'ok/s':>8} {'ratio':>6} "
            f"{'p50 ms':>8} {'p99 ms':>8} {'errors':>6}"
        )
        for handler in args.handlers:
            grpc_port = free_port()
            env = {
                "SERVING_HANDLER": f"handlers/{handler}/handler.py",
                "SERVING_WORKER_CLASS": args.worker_class,
                "SERVING_GRPC_PORT": str(grpc_port),
                "SERVING_CACHE_SIZE": "0",
            }
            with gunicorn_server(env, ready_timeout_s=300) as server:
                server.grpc = f"127.0.0.1:{grpc_port}"  # type: ignore[attr-defined]
                model = requests.get(server.url + "/metadata", timeout=10).json()["name"]
                for front in FRONTS[:3]:  # warm-up: the cost model and the allocator settle
                    drive(front, server, model, 8, 3)
                for round_ in range(1, args.rounds + 1):
                    before = bare.measure_cell(selection.cell, CELL_S)
                    shift = (round_ - 1) % len(FRONTS)
                    for front in FRONTS[shift:] + FRONTS[:shift]:
                        row = drive(front, server, model, args.concurrency, args.seconds)
                        after = bare.measure_cell(selection.cell, CELL_S)
                        limit = (before + after) / 2
                        row.update(handler=handler, round=round_, front=front, limit=limit)
                        row.update(limit_before=before, limit_after=after)
                        row["ratio"] = row["ok_per_s"] / limit
                        before = after
                        rows.append(row)
                        print(
                            f"{handler:>12} {round_:>5} {front:>8} {limit:>8.1f} "
                            f"{row['ok_per_s']:>8.1f} {row['ratio']:>6.2f} {row['p50_ms']:>8.2f} "
                            f"{row['p99_ms']:>8.2f} {row['errors']:>6}",
                            flush=True,
                        )
                        time.sleep(1)
    print(f"\nmedians over {args.rounds} rounds, c={args.concurrency}")
    print(
        f"{'handler':>12} {'front':>8} {'ok/s':>8} {'ratio':>6} {'range':>11} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'÷ /predict':>10}"
    )
    for handler in args.handlers:
        mine = [r for r in rows if r["handler"] == handler]
        for front in FRONTS:
            these = [r for r in mine if r["front"] == front]
            ratios = [r["ratio"] for r in these]
            # Per round: this front over /predict of the same round, then the median.
            over = statistics.median(
                r["ok_per_s"]
                / next(p for p in mine if p["front"] == "predict" and p["round"] == r["round"])[
                    "ok_per_s"
                ]
                for r in these
            )
            print(
                f"{handler:>12} {front:>8} {statistics.median(r['ok_per_s'] for r in these):>8.1f} "
                f"{statistics.median(ratios):>6.2f} {min(ratios):>5.2f}-{max(ratios):<5.2f} "
                f"{statistics.median(r['p50_ms'] for r in these):>8.2f} "
                f"{statistics.median(r['p99_ms'] for r in these):>8.2f} {over:>10.2f}"
            )
    suffix = "" if args.worker_class == "gevent" else f"-{args.worker_class}"
    out = ROOT / "bench" / "figures" / f"protocols{suffix}.json"
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
