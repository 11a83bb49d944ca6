"""What nginx in front costs: MiniLM requests/s at concurrency 32, through nginx vs direct.

One run starts one ``serving-core serve`` (the MiniLM handler, default
settings) and one nginx in front of it, configured as its image configures
it (``tests/nginx_server``: ``nginx/entrypoint.sh`` and ``nginx/templates``),
warms both paths up at full load, then drives them with ``wrk`` (keep-alive
connections, ``bench/post.lua``, the sentences of ``bench/workload.py``) in
alternating rounds. Each round pairs a direct and a proxied measurement taken
back to back, so slow drift (CPU steal, frequency) falls on both alike; the
ratio reported is the median of the per-round ratios, next to each path's
median. The goal is >= 0.95.

Between measurements the load pauses longer than nginx keeps idle upstream
connections (SERVING_KEEPALIVE_S - 1 s): with several gunicorn workers, how
the connections happen to split across them moves throughput by several
percent, and each wrk run opens new client connections, so nginx must open
new upstream ones too or the direct path would sample that split every round
and the proxied path only once.

    .venv/bin/python bench/nginx_overhead.py [--rounds 3] [--seconds 10] [--concurrency 32]
        [--env SERVING_X=Y ...] [--nginx-env NGINX_X=Y ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.served import wrk  # noqa: E402
from tests.nginx_server import nginx_server  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402

GOAL = 0.95


def measure(
    app_env: dict[str, str],
    nginx_env: dict[str, str],
    *,
    rounds: int,
    seconds: float,
    concurrency: int,
    warmup_s: float,
    pause_s: float,
) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {"direct": [], "nginx": []}
    with (
        gunicorn_server(app_env, ready_timeout_s=180) as app,
        nginx_server(app.bind, nginx_env) as proxy,
    ):
        urls = {"direct": app.url, "nginx": proxy.url}
        for url in urls.values():  # warm-up: cost model, allocator, keep-alive pools
            wrk(url, concurrency, warmup_s)
        for round_ in range(rounds):
            # Alternate which path goes first, so neither always follows a pause.
            order = ["direct", "nginx"] if round_ % 2 == 0 else ["nginx", "direct"]
            for path in order:
                time.sleep(pause_s)
                row = wrk(urls[path], concurrency, seconds)
                results[path].append(row)
                print(
                    f"round {round_ + 1} {path:>6}: {row['ok_per_s']:8.1f} ok/s  "
                    f"p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
                    f"non-200 {row['requests'] - row['statuses'].get('200', 0)}  "
                    f"socket errors {row['socket_errors']}",
                    flush=True,
                )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds per path")
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y for the app")
    parser.add_argument("--nginx-env", nargs="*", default=[], help="extra NGINX_X=Y for nginx")
    parser.add_argument("--check", action="store_true", help=f"exit 1 below the {GOAL} goal")
    args = parser.parse_args()
    app_env = {"SERVING_HANDLER": "handlers/minilm/handler.py"}
    app_env.update(item.split("=", 1) for item in args.env)
    nginx_env = dict(item.split("=", 1) for item in args.nginx_env)
    results = measure(
        app_env,
        nginx_env,
        rounds=args.rounds,
        seconds=args.seconds,
        concurrency=args.concurrency,
        warmup_s=args.warmup,
        # nginx closes idle upstream connections 1 s before gunicorn's keep-alive.
        pause_s=float(app_env.get("SERVING_KEEPALIVE_S", "5")) + 0.5,
    )
    direct = statistics.median(r["ok_per_s"] for r in results["direct"])
    proxied = statistics.median(r["ok_per_s"] for r in results["nginx"])
    pairs = zip(results["direct"], results["nginx"], strict=True)
    ratio = statistics.median(n["ok_per_s"] / d["ok_per_s"] for d, n in pairs)
    failed = sum(
        r["requests"] - r["statuses"].get("200", 0) + r["socket_errors"]
        for rows in results.values()
        for r in rows
    )
    print(f"concurrency {args.concurrency}, median of {args.rounds} x {args.seconds:g} s rounds")
    print(f"straight to gunicorn: {direct:8.1f} requests/s")
    print(f"through nginx:        {proxied:8.1f} requests/s")
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"ratio (median of rounds): {ratio:.3f}  (goal >= {GOAL}: {verdict})")
    if failed:
        print(f"{failed} requests failed (non-200 or socket errors): the figures are suspect")
    return 1 if args.check and (ratio < GOAL or failed) else 0


if __name__ == "__main__":
    sys.exit(main())
