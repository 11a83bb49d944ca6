"""Open-loop overload: requests at a fixed rate, whatever the server answers.

A closed-loop load (wrk) slows down with the server and never overloads it
for long; this one sends at ``--times`` x the measured capacity, so the queue
would grow without bound but for admission control. It reports the goodput,
how many requests were refused and how fast (the goal: a 503 within 10 ms of
arrival), how many were answered within their deadline, and the 504s.

    .venv/bin/python bench/overload.py [--times 2] [--seconds 20] [--timeout-s 2]
        [--policy adaptive] [--limit SENTENCES_PER_S]
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

from bench import bare_model  # noqa: E402
from bench.served import wrk  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402


class Client:
    """Keep-alive HTTP/1.1 connections, opened on demand up to a maximum."""

    def __init__(self, host: str, port: int, max_connections: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.open = 0
        self.max = max_connections
        self.freed = asyncio.Condition()

    async def _acquire(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with self.freed:
            while not self.idle and self.open >= self.max:
                await self.freed.wait()
            if self.idle:
                return self.idle.pop()
            self.open += 1
        return await asyncio.open_connection(self.host, self.port)

    async def _release(self, conn: Any, reusable: bool) -> None:
        async with self.freed:
            if reusable:
                self.idle.append(conn)
            else:
                self.open -= 1
                conn[1].close()
            self.freed.notify()

    async def post(self, body: bytes) -> int:
        conn = await self._acquire()
        reader, writer = conn
        try:
            writer.write(
                b"POST /predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            status_line = await reader.readline()
            status = int(status_line.split()[1])
            length, close = 0, False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
                elif name.lower() == "connection" and value.strip().lower() == "close":
                    close = True
            await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError):
            await self._release(conn, False)
            return 0
        await self._release(conn, not close)
        return status


async def open_loop(url: str, rate: float, seconds: float, max_connections: int) -> list[Any]:
    host, port = url.removeprefix("http://").split(":")
    client = Client(host, int(port), max_connections)
    bodies = [f'{{"text": "{s}"}}'.encode() for s in SENTENCES]
    results: list[tuple[int, float]] = []

    async def one(i: int, scheduled: float) -> None:
        status = await client.post(bodies[i % len(bodies)])
        results.append((status, time.monotonic() - scheduled))

    start = time.monotonic() + 0.1
    tasks = []
    for i in range(int(rate * seconds)):
        scheduled = start + i / rate
        delay = scheduled - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, scheduled)))
    await asyncio.gather(*tasks)
    return results


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=float, default=2.0, help="offered load / capacity")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--timeout-s", type=float, default=2.0, help="SERVING_REQUEST_TIMEOUT_S")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--limit", type=float, help="skip the bare-model run; use this limit")
    args = parser.parse_args()
    limit = args.limit or bare_model.measure(3.0)["limit_per_s"]
    env = {
        "SERVING_BATCH_POLICY": args.policy,
        "SERVING_REQUEST_TIMEOUT_S": str(args.timeout_s),
    }
    with gunicorn_server(env) as server:
        wrk(server.url, 8, 3)  # warm-up
        capacity = wrk(server.url, 32, 8)["ok_per_s"]
        rate = args.times * capacity
        cpu_before, wall_before = time.process_time(), time.monotonic()
        results = asyncio.run(open_loop(server.url, rate, args.seconds, args.connections))
        client_cores = (time.process_time() - cpu_before) / (time.monotonic() - wall_before)
    ok = [t for s, t in results if s == 200]
    refused = [t for s, t in results if s == 503]
    late = [s for s, _ in results if s == 504]
    other = [s for s, _ in results if s not in (200, 503, 504)]
    duration = args.seconds
    print(f"bare-model limit {limit:.1f}/s; closed-loop capacity (c=32) {capacity:.1f}/s")
    print(
        f"offered {rate:.1f}/s ({args.times:g}x capacity) for {duration:g} s, "
        f"policy {args.policy}, deadline {args.timeout_s:g} s"
    )
    print(
        f"answered 200: {len(ok)} ({len(ok) / duration:.1f}/s = {len(ok) / duration / limit:.2f}"
        f" x limit); p50 {percentile(ok, 50) * 1000:.1f} ms, p99 {percentile(ok, 99) * 1000:.1f}"
        f" ms; within deadline {sum(t <= args.timeout_s for t in ok) / max(1, len(ok)):.3%}"
    )
    print(
        f"refused 503: {len(refused)} ({len(refused) / max(1, len(results)):.1%}); "
        f"p50 {percentile(refused, 50) * 1000:.1f} ms, p99 {percentile(refused, 99) * 1000:.1f} ms,"
        f" within 10 ms {sum(t <= 0.010 for t in refused) / max(1, len(refused)):.1%}"
    )
    print(f"504: {len(late)} ({len(late) / max(1, len(results)):.2%}); other/errors: {len(other)}")
    print(f"the load generator itself used {client_cores:.2f} of a core (on the same machine)")


if __name__ == "__main__":
    main()
