"""The worst day: an overload that ends, and a storm of connections, then how fast it recovers.

Two measurements against ``serving-core serve`` (MiniLM, the defaults but the
deadline), each in rounds:

1. **Overload, then normal load.** Open loop (``overload.open_loop``: requests
   at a fixed rate, whatever the server answers) at ``--times`` x the
   closed-loop capacity (c=32, measured first) for ``--seconds``, then at
   ``--after`` x capacity for ``--after-seconds``, one schedule with no gap.
   Per phase: the answers by status, the refusals' p50/p99 (goal: 503 p99
   under 10 ms), the admitted requests' p99 against the deadline. Recovery:
   from the switch to the last request of the second phase that was not a 200
   within the deadline (0 when there was none; goal: under 1 s).
2. **After a storm.** wrk with ``--storm-connections`` (512) keep-alive
   connections for ``--storm-seconds`` (20), then, as soon as wrk has exited,
   one request on a new connection: its status and latency (goal: a 200
   within 1 s). Work for clients that have gone must not keep the workers busy.

    .venv/bin/python bench/storm.py [--times 10] [--seconds 30] [--after 0.5]
        [--after-seconds 15] [--storm-connections 512] [--storm-seconds 20]
        [--rounds 3] [--timeout-s 2] [--env SERVING_X=Y ...]

SERVING_CACHE_SIZE=0: the workload repeats its sentences, which the inference
cache would answer.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overload import Client, percentile  # noqa: E402
from bench.served import wrk  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402


class TimedClient(Client):
    """``Client``, noting when each request was written: latencies count from there,
    so a load generator falling behind its schedule (one Python process offering
    thousands of requests a second) does not pass for a slow server."""

    def __init__(self, host: str, port: int, max_connections: int) -> None:
        super().__init__(host, port, max_connections)
        self.sent: dict[Any, float] = {}

    async def _post(self, body: bytes, conn: Any) -> int:
        self.sent[asyncio.current_task()] = time.monotonic()
        return await super()._post(body, conn)


async def phased_loop(
    url: str, phases: list[tuple[float, float]], max_connections: int
) -> list[tuple[int, int, float, float]]:
    """Requests at each phase's rate for its seconds, back to back: (phase, status,
    seconds after the first phase's start it was due, latency from its sending)."""
    host, port = url.removeprefix("http://").split(":")
    client = TimedClient(host, int(port), max_connections)
    bodies = [f'{{"text": "{s}"}}'.encode() for s in SENTENCES]
    results: list[tuple[int, int, float, float]] = []
    start = time.monotonic() + 0.1

    async def one(i: int, phase: int, due: float) -> None:
        status = await client.post(bodies[i % len(bodies)])
        sent = client.sent.pop(asyncio.current_task(), due)
        results.append((phase, status, due - start, time.monotonic() - sent))

    tasks = []
    offset = 0.0
    i = 0
    for phase, (rate, seconds) in enumerate(phases):
        for k in range(int(rate * seconds)):
            due = start + offset + k / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, phase, due)))
            i += 1
        offset += seconds
    await asyncio.gather(*tasks)
    return results


def summarise(
    results: list[tuple[int, int, float, float]], phase: int, timeout_s: float
) -> dict[str, Any]:
    mine = [(s, t) for p, s, _, t in results if p == phase]
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
    }


def overload_then_normal(url: str, args: argparse.Namespace) -> dict[str, Any]:
    capacity = wrk(url, 32, 8)["ok_per_s"]
    phases = [(args.times * capacity, args.seconds), (args.after * capacity, args.after_seconds)]
    results = asyncio.run(phased_loop(url, phases, args.connections))
    switch = args.seconds
    bad_after = [
        due - switch
        for phase, status, due, latency in results
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
    }


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
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y settings")
    args = parser.parse_args()
    env = {
        "SERVING_REQUEST_TIMEOUT_S": str(args.timeout_s),
        "SERVING_CACHE_SIZE": "0",
        **dict(item.split("=", 1) for item in args.env),
    }
    with gunicorn_server(env) as server:
        wrk(server.url, 8, 3)  # warm-up
        if args.skip != "overload":
            print(
                f"open loop at {args.times:g}x capacity for {args.seconds:g} s, then "
                f"{args.after:g}x for {args.after_seconds:g} s; deadline {args.timeout_s:g} s"
            )
            rounds = [overload_then_normal(server.url, args) for _ in range(args.rounds)]
            for n, r in enumerate(rounds, 1):
                o, a = r["overload"], r["after"]
                print(
                    f"round {n}: capacity {r['capacity']:.1f}/s | overload: 200 {o['ok']:.1%} "
                    f"(p99 {o['ok_p99_ms']:.0f} ms, {o['ok_within_deadline']:.2%} in deadline), "
                    f"503 {o['refused']:.1%} (p50 {o['refused_p50_ms']:.1f} / p99 "
                    f"{o['refused_p99_ms']:.1f} ms), 504 {o['late_504']:.2%}, other {o['other']} "
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
                r = after_storm(server.url, args)
                print(
                    f"round {n}: storm {r['storm_ok_per_s']:.1f} 200/s {r['storm_statuses']} | "
                    f"first request after: {r['first_status']} in {r['first_ms']:.1f} ms "
                    "(goal: 200 within 1000 ms)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
