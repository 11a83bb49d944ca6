"""The worst day: an overload that ends, and a storm of connections, then how fast it recovers.

Two measurements against ``serving-core serve`` (MiniLM, the defaults but the
deadline), each in rounds, through nginx as deployed (``--front nginx``, the
default: the image's own configuration, ``NGINX_UPSTREAM_MAX_CONNS`` set as
docs/deployment/nginx.md says, to what the app can hold) or straight to gunicorn:

1. **Overload, then normal load.** Open loop (``openloop.run``: requests
   at a fixed rate, whatever the server answers) at ``--times`` x the
   closed-loop capacity (c=32, measured first) for ``--seconds``, then at
   ``--after`` x capacity for ``--after-seconds``, one schedule with no gap.
   Per phase: the answers by status, the refusals' p50/p99 (goal: 503 p99
   under 10 ms), the admitted requests' p99 against the deadline. Recovery:
   from the switch to the last request of the second phase that was not a 200
   within the deadline (0 when there was none; goal: under 1 s). Latencies
   count from when each request was due, so the generator's own lag (printed)
   counts against the server.
2. **After a storm.** wrk with ``--storm-connections`` (512) keep-alive
   connections for ``--storm-seconds`` (20), then, as soon as wrk has exited,
   one request on a new connection: its status and latency (goal: a 200
   within 1 s). Work for clients that have gone must not keep the workers busy.

    .venv/bin/python bench/storm.py [--times 10] [--seconds 30] [--after 0.5]
        [--after-seconds 15] [--storm-connections 512] [--storm-seconds 20]
        [--rounds 3] [--timeout-s 2] [--front nginx|gunicorn] [--skip overload|storm]
        [--env SERVING_X=Y ...]

SERVING_CACHE_SIZE=0: the workload repeats its sentences, which the inference
cache would answer. Run as root, the load generator takes nice -5: it stands in
for clients on other machines, so its own scheduling delays stay small.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import openloop  # noqa: E402
from bench.overload import percentile  # noqa: E402
from bench.served import wrk  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from serving_core.settings import Settings  # noqa: E402
from tests.nginx_server import nginx_server  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402


def phased_loop(
    url: str, phases: list[tuple[float, float]], max_connections: int
) -> list[openloop.Result]:
    """Requests at each phase's rate for its seconds, back to back (``openloop.run``)."""
    bodies = [f'{{"text": "{s}"}}'.encode() for s in SENTENCES]
    load = openloop.run(url, phases, bodies, max_connections=max_connections)
    results, _ = asyncio.run(load)
    return results


def summarise(results: list[openloop.Result], phase: int, timeout_s: float) -> dict[str, Any]:
    mine = [(s, t) for p, s, _, t, _ in results if p == phase]
    lag = [late for p, _, _, _, late in results if p == phase]
    ok = [t for s, t in mine if s == 200]
    refused = [t for s, t in mine if s == 503]
    n = max(1, len(mine))
    return {
        "requests": len(mine),
        "ok": len(ok) / n,
        "refused": len(refused) / n,
        "late_504": sum(s == 504 for s, _ in mine) / n,
        "other": sum(s not in (200, 503, 504) for s, _ in mine),
        "ok_p99_ms": percentile(ok, 99) * 1000,
        "ok_within_deadline": sum(t <= timeout_s for t in ok) / max(1, len(ok)),
        "refused_p50_ms": percentile(refused, 50) * 1000,
        "refused_p99_ms": percentile(refused, 99) * 1000,
        "refused_within_10ms": sum(t <= 0.010 for t in refused) / max(1, len(refused)),
        "sent_late_p99_ms": percentile(lag, 99) * 1000,
        # The same refusals timed from when each went out, the generator's lag left out.
        "refused_sent_p99_ms": percentile(
            [t - late for p, s, _, t, late in results if p == phase and s == 503], 99
        )
        * 1000,
    }


def overload_then_normal(url: str, args: argparse.Namespace) -> dict[str, Any]:
    capacity = wrk(url, 32, 8)["ok_per_s"]
    phases = [(args.times * capacity, args.seconds), (args.after * capacity, args.after_seconds)]
    results = phased_loop(url, phases, args.connections)
    switch = args.seconds
    bad_after = [
        due - switch
        for phase, status, due, latency, _ in results
        if phase == 1 and (status != 200 or latency > args.timeout_s)
    ]
    return {
        "capacity": capacity,
        "overload": summarise(results, 0, args.timeout_s),
        "after": summarise(results, 1, args.timeout_s),
        "recovery_s": max(bad_after, default=0.0),
        "not_recovered": len(bad_after),
    }


def after_storm(url: str, args: argparse.Namespace) -> dict[str, Any]:
    storm = wrk(url, args.storm_connections, args.storm_seconds)
    started = time.monotonic()
    response = requests.post(url + "/predict", json={"text": "the first one after"}, timeout=30)
    return {
        "storm_ok_per_s": storm["ok_per_s"],
        "storm_statuses": storm["statuses"],
        "first_status": response.status_code,
        "first_ms": (time.monotonic() - started) * 1000,
        # Why it was refused, when it was: a queue still full, or a predicted miss.
        "first_error": "" if response.ok else response.text[:160],
    }


def upstream_max_conns(env: dict[str, str]) -> int:
    """What the app can hold at once, as docs/deployment/nginx.md says to set
    NGINX_UPSTREAM_MAX_CONNS: SERVING_WORKERS x (SERVING_MAX_QUEUE + SERVING_MAX_BATCH_SIZE),
    defaults resolved."""
    settings = Settings.from_env({**os.environ, **env})
    return settings.workers * (settings.max_queue + settings.max_batch_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--after", type=float, default=0.5)
    parser.add_argument("--after-seconds", type=float, default=15.0)
    parser.add_argument("--connections", type=int, default=1500)
    parser.add_argument("--storm-connections", type=int, default=512)
    parser.add_argument("--storm-seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=2.0, help="SERVING_REQUEST_TIMEOUT_S")
    parser.add_argument("--skip", choices=["overload", "storm"], help="run only the other one")
    parser.add_argument(
        "--front",
        choices=["nginx", "gunicorn"],
        default="nginx",
        help="send to nginx (the deployed shape, NGINX_UPSTREAM_MAX_CONNS set to what the "
        "app holds) or straight to gunicorn",
    )
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y settings")
    args = parser.parse_args()
    try:
        # The load generator stands in for clients on other machines: ahead of the
        # server's processes for the CPU, its own scheduling delays (which count
        # against the server, latencies being timed from when each request was
        # due) stay small. Needs root; without it, it runs as it is.
        os.nice(-5)
        print("load generator at nice -5")
    except PermissionError:
        print("load generator at the default priority (not root)")
    env = {
        "SERVING_REQUEST_TIMEOUT_S": str(args.timeout_s),
        "SERVING_CACHE_SIZE": "0",
        **dict(item.split("=", 1) for item in args.env),
    }
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(gunicorn_server(env))
        url = server.url
        if args.front == "nginx":
            cap = upstream_max_conns(env)
            proxy = stack.enter_context(
                nginx_server(
                    server.bind,
                    {
                        "SERVING_REQUEST_TIMEOUT_S": str(args.timeout_s),
                        "NGINX_UPSTREAM_MAX_CONNS": str(cap),
                        "NGINX_WORKER_CONNECTIONS": "4096",
                        # The chart's default: one nginx worker beside the app.
                        "NGINX_WORKER_PROCESSES": "1",
                        # One client address sends it all: no per-client limit.
                        "NGINX_CONN_LIMIT_PER_CLIENT": "0",
                    },
                )
            )
            url = proxy.url
            print(f"through nginx, NGINX_UPSTREAM_MAX_CONNS={cap}")
        else:
            print("straight to gunicorn")
        wrk(url, 8, 3)  # warm-up
        if args.skip != "overload":
            print(
                f"open loop at {args.times:g}x capacity for {args.seconds:g} s, then "
                f"{args.after:g}x for {args.after_seconds:g} s; deadline {args.timeout_s:g} s"
            )
            rounds = [overload_then_normal(url, args) for _ in range(args.rounds)]
            for n, r in enumerate(rounds, 1):
                o, a = r["overload"], r["after"]
                print(
                    f"round {n}: capacity {r['capacity']:.1f}/s | overload: 200 {o['ok']:.1%} "
                    f"(p99 {o['ok_p99_ms']:.0f} ms, {o['ok_within_deadline']:.2%} in deadline), "
                    f"503 {o['refused']:.1%} (p50 {o['refused_p50_ms']:.1f} / p99 "
                    f"{o['refused_p99_ms']:.1f} ms, {o['refused_within_10ms']:.2%} within 10 ms), "
                    f"504 {o['late_504']:.2%}, other {o['other']}, generator lag p99 "
                    f"{o['sent_late_p99_ms']:.1f} ms (503 p99 from sending "
                    f"{o['refused_sent_p99_ms']:.1f} ms) "
                    f"| after: 200 {a['ok']:.1%} (p99 {a['ok_p99_ms']:.0f} ms), 503 "
                    f"{a['refused']:.1%}, 504 {a['late_504']:.2%}, other {a['other']} "
                    f"| recovered {r['recovery_s']:.2f} s after the switch "
                    f"({r['not_recovered']} requests not 200 in time)",
                    flush=True,
                )
            median = statistics.median(r["recovery_s"] for r in rounds)
            print(f"recovery median {median:.2f} s (goal < 1 s)")
        if args.skip != "storm":
            print(
                f"\nwrk c={args.storm_connections} for {args.storm_seconds:g} s, then one request"
            )
            for n in range(1, args.rounds + 1):
                r = after_storm(url, args)
                print(
                    f"round {n}: storm {r['storm_ok_per_s']:.1f} 200/s {r['storm_statuses']} | "
                    f"first request after: {r['first_status']} in {r['first_ms']:.1f} ms "
                    f"(goal: 200 within 1000 ms) {r['first_error']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
