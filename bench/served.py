"""Served MiniLM throughput and latency through gunicorn, as a ratio of the bare model.

Measures the bare-model limit first (``bare_model.py``, same run, same
machine), then starts ``serving-core serve`` and drives it with ``wrk``
(closed loop, keep-alive connections) at each concurrency.

    .venv/bin/python bench/served.py [--policy adaptive fixed] [--concurrency 1 8 32]
        [--seconds 10] [--limit SENTENCES_PER_S] [--env SERVING_X=Y ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bare_model  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402

LUA = ROOT / "bench" / "post.lua"


def wrk(url: str, connections: int, seconds: float, delay_ms: float = 0.0) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(SENTENCES))
    env = dict(os.environ, WRK_SENTENCES=f.name, WRK_DELAY_MS=str(delay_ms))
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


def run(env: dict[str, str], concurrencies: list[int], seconds: float) -> list[dict[str, Any]]:
    rows = []
    with gunicorn_server(env) as server:
        wrk(server.url, 8, 3)  # warm-up: the cost model and the allocator settle
        for connections in concurrencies:
            result = wrk(server.url, connections, seconds)
            result["concurrency"] = connections
            rows.append(result)
            time.sleep(1)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", nargs="+", default=["adaptive"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--limit", type=float, help="skip the bare-model run; use this limit")
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y settings")
    args = parser.parse_args()
    if args.limit:
        limit, batch1_ms = args.limit, None
    else:
        bare = bare_model.measure(3.0)
        limit, batch1_ms = bare["limit_per_s"], bare["batch1_ms"]
        print(
            f"bare model: limit {limit:.1f} sentences/s (one process on all cores "
            f"{bare['best_one_process']:.1f}, one per core {bare['best_process_per_core']:.1f}); "
            f"batch-1 latency {batch1_ms:.2f} ms on all cores, "
            f"{bare['batch1_ms_one_thread']:.2f} ms on one thread (a served worker's)"
        )
    extra = dict(item.split("=", 1) for item in args.env)
    print(
        f"{'policy':>8} {'conc':>5} {'ok/s':>8} {'ratio':>6} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'503':>6} {'504':>5} {'errors':>6}"
    )
    for policy in args.policy:
        env = {"SERVING_BATCH_POLICY": policy, **extra}
        for row in run(env, args.concurrency, args.seconds):
            print(
                f"{policy:>8} {row['concurrency']:>5} {row['ok_per_s']:>8.1f} "
                f"{row['ok_per_s'] / limit:>6.2f} {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} "
                f"{row['rejected']:>6} {row['timed_out']:>5} {row['socket_errors']:>6}"
            )


if __name__ == "__main__":
    main()
