"""The inference cache through gunicorn: a hit's latency, and throughput when half repeat.

For each store (off, each worker's memory, a shared Redis that this script
starts on 127.0.0.1) it serves MiniLM with ``serving-core serve`` and drives
it with ``wrk`` (``bench/cache.lua``, keep-alive connections, closed loop):

- hits: one connection posting only the 64 sentences of ``workload.py``,
  after a pass that cached them; its p50 and p99 are a hit's latency (the
  ``X-Cache`` counts printed show they were hits);
- half: ``--concurrency`` connections where every other request is one of
  those sentences and the rest are sentences never sent before; requests/s,
  p50, p99 and the share answered from the cache.

    .venv/bin/python bench/cache.py [--stores off memory redis] [--seconds 10]
        [--concurrency 32] [--env SERVING_X=Y ...]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workload import SENTENCES  # noqa: E402
from serving_core.cores import usable_cores  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402

LUA = ROOT / "bench" / "cache.lua"
_runs = itertools.count()


def wrk(url: str, mode: str, connections: int, seconds: float) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install wrk")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(SENTENCES))
    env = dict(
        os.environ,
        WRK_SENTENCES=f.name,
        WRK_MODE=mode,
        # Unique sentences stay unique across runs against the same cache.
        WRK_RUN=f"{os.getpid()}-{next(_runs)}",
    )
    command = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{round(seconds)}s"]
    command += ["--timeout", "30s", "-s", str(LUA), url]
    out = subprocess.run(
        command,
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
    result["ok_per_s"] = result["statuses"].get("200", 0) / result["duration_s"]
    result["hit_share"] = result["x_cache"].get("hit", 0) / max(1, result["requests"])
    return result


@contextlib.contextmanager
def store_settings(store: str) -> Iterator[dict[str, str]]:
    if store == "off":
        yield {"SERVING_CACHE_SIZE": "0", "SERVING_CACHE_URL": ""}
    elif store == "memory":
        yield {"SERVING_CACHE_URL": ""}
    else:
        with redis_server() as url:
            yield {"SERVING_CACHE_URL": url}


def cache_hot_sentences(url: str, workers: int) -> None:
    """Post every hot sentence on fresh connections until each worker has likely seen it."""
    for sentence in SENTENCES:
        for _ in range(4 * workers):
            response = requests.post(url + "/predict", json={"text": sentence}, timeout=30)
            response.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", nargs="+", default=["off", "memory", "redis"])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y settings")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    print(
        f"{'store':>7} | {'hit p50 ms':>10} {'hit p99 ms':>10} {'X-Cache':>16} | "
        f"{'c':>3} {'ok/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'from cache':>10} {'non-200':>7}"
    )
    for store in args.stores:
        # X-Cache is off by default; the hit share below counts it.
        env = {"SERVING_CACHE_HEADER": "true", **extra}
        with store_settings(store) as settings, gunicorn_server({**settings, **env}) as server:
            workers = int(extra.get("SERVING_WORKERS") or 0) or usable_cores()
            wrk(server.url, "half", 8, 3)  # warm-up: the cost model and the allocator settle
            hit_cols = f"{'-':>10} {'-':>10} {'-':>16}"
            if store != "off":
                cache_hot_sentences(server.url, workers)
                hits = wrk(server.url, "hits", 1, args.seconds)
                counts = ",".join(f"{k}:{v}" for k, v in sorted(hits["x_cache"].items()))
                hit_cols = f"{hits['p50_ms']:>10.2f} {hits['p99_ms']:>10.2f} {counts:>16}"
            time.sleep(1)
            half = wrk(server.url, "half", args.concurrency, args.seconds)
            not_ok = half["requests"] - half["statuses"].get("200", 0) + half["socket_errors"]
            print(
                f"{store:>7} | {hit_cols} | {args.concurrency:>3} {half['ok_per_s']:>7.1f} "
                f"{half['p50_ms']:>7.2f} {half['p99_ms']:>7.2f} {half['hit_share']:>10.2f} "
                f"{not_ok:>7}",
                flush=True,
            )


if __name__ == "__main__":
    main()
