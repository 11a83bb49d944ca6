"""The paths ``framework_cost.py`` measures: each starts its serving side, warms it up,
and measures ``--rounds`` windows of a fixed number of items (``window``).

Every path function takes the ``Context`` and returns one row a round: ``items``,
``cpu_s`` (the serving side's session), ``batch`` (the mean of the service's
``serving_batch_size`` over the window, or None where it reports none), and, where
they apply, ``flask_cpu_s``/``flask_items`` (a bare Flask app on the same worker
class, same load) and ``broker_cpu_s`` (the broker's processes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import requests

from bench.cpu_path import hello_server
from bench.cpu_path import wrk as wrk_count
from bench.interleave import busy_s
from bench.proc_cpu import session_cpu_s, session_ticks, tree_cpu_s
from bench.protocols import grpc_load
from tests.servers import SERVING_CORE, base_env, free_port, stop

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 300  # items before the first window: imports, JIT caches, connections
GTHREAD_THREADS = 4 * 16  # serving-core's default gthread threads (cpu_path.py's too)
POLL_S = 0.05


class Context:
    """The run's options, the tree measured, its handler (path) and the handler's name."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tree = ROOT
        self.handler = ""
        self.name = ""

    def env(self, overrides: Mapping[str, str]) -> dict[str, str]:
        """A child's environment: no SERVING_ of ours, the cache off, ``--tree`` first."""
        env = base_env({"SERVING_CACHE_SIZE": "0", **overrides})
        if self.args.tree:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(self.args.tree.resolve()), env.get("PYTHONPATH")) if p
            )
        return env

    def start(
        self, command: str, overrides: Mapping[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        """``serving-core COMMAND`` in a session of its own, in the tree (gunicorn puts its
        working directory first on sys.path)."""
        with log.open("wb") as out:
            return subprocess.Popen(
                [str(SERVING_CORE), command],
                cwd=self.tree,
                env=self.env(overrides),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def wait_until(
    ok: Callable[[], bool], process: subprocess.Popen[bytes], log: Path, timeout_s: float = 300.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(
                f"{process.args[1:]} exited or timed out:\n{log.read_text()[-3000:]}"
            )
        time.sleep(POLL_S)


def answers(url: str) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(url, timeout=2).status_code == 200
    return False


def batch_stats(url: str | None) -> tuple[float, float]:
    """``serving_batch_size``'s sum and count so far (every label set), or zeros."""
    if url is None:
        return 0.0, 0.0
    try:
        text = requests.get(url + "/metrics", timeout=5).text
    except requests.RequestException:
        return 0.0, 0.0
    sums = [0.0, 0.0]
    for line in text.splitlines():
        for i, name in enumerate(("serving_batch_size_sum", "serving_batch_size_count")):
            if line.startswith(name) and line[len(name)] in " {":
                sums[i] += float(line.rsplit(" ", 1)[1])
    return sums[0], sums[1]


def window(
    session: int, run: Callable[[], int], url: str | None = None, broker: int | None = None
) -> dict[str, Any]:
    """The session's CPU over ``run`` (which returns the items it put through)."""
    batch_at = batch_stats(url)
    broker_at = tree_cpu_s(broker) if broker else 0.0
    cpu_at, wall_at, busy_at = session_cpu_s(session), time.monotonic(), busy_s()
    items = run()
    cpu, wall = session_cpu_s(session) - cpu_at, time.monotonic() - wall_at
    busy = busy_s() - busy_at
    broker_cpu = tree_cpu_s(broker) - broker_at if broker else None
    if url is not None:
        time.sleep(0.3)  # the model thread writes its histograms every 0.25 s (FLUSH_S)
    batch_sum, batch_count = (a - b for a, b in zip(batch_stats(url), batch_at, strict=True))
    batch = batch_sum / batch_count if batch_count >= items / 64 else None
    # The machine's CPU that was neither the session's nor the broker's: the load
    # generator, this script, and whatever else runs (noise on a shared machine).
    rest = busy - cpu - (broker_cpu or 0.0)
    return {
        "items": items,
        "cpu_s": cpu,
        "wall_s": wall,
        "rest_cores": rest / wall,
        "processes": len(session_ticks(session)),
        "batch": batch,
        "broker_cpu_s": broker_cpu,
    }


def wrk_items(url: str, count: int, connections: int, v2_model: str = "") -> int:
    """``count`` POSTs by wrk (cpu_path.lua, every body unique): the requests made."""
    # cpu_path.wrk hands wrk this process's environment, which the script reads.
    os.environ["WRK_V2_MODEL"] = v2_model
    if not v2_model:
        del os.environ["WRK_V2_MODEL"]
    return int(wrk_count(url, count, connections, 1)["requests"])


@contextlib.contextmanager
def served(ctx: Context, overrides: Mapping[str, str]) -> Iterator[tuple[int, str]]:
    """``serving-core serve``, one worker: (its session, its URL) once /readyz is 200."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="framework-cost-") as tmp:
        log = Path(tmp) / "serve.log"
        env = {
            "SERVING_HANDLER": ctx.handler,
            "SERVING_BIND": f"127.0.0.1:{port}",
            "SERVING_WORKERS": "1",
            "SERVING_JOBS_PATH": f"{tmp}/jobs.db",
            **overrides,
        }
        process = ctx.start("serve", env, log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: answers(url + "/readyz"), process, log)
            yield process.pid, url
        finally:
            stop(process, quick=True)


def predict(worker_class: str) -> Callable[[Context], list[dict[str, Any]]]:
    def path(ctx: Context) -> list[dict[str, Any]]:
        n, c = ctx.args.items, ctx.args.connections
        rows = []
        with (
            hello_server(worker_class, GTHREAD_THREADS) as (flask_url, flask),
            served(ctx, {"SERVING_WORKER_CLASS": worker_class}) as (session, url),
        ):
            wrk_items(flask_url, WARM_UP, c)
            wrk_items(url, WARM_UP, c)
            for round_ in range(1, ctx.args.rounds + 1):
                row = window(session, lambda: wrk_items(url, n, c), url)
                bare = window(flask, lambda: wrk_items(flask_url, n, c))
                row.update(round=round_, flask_cpu_s=bare["cpu_s"], flask_items=bare["items"])
                rows.append(row)
        return rows

    return path


def v2_rest(ctx: Context) -> list[dict[str, Any]]:
    n, c = ctx.args.items, ctx.args.connections
    with served(ctx, {}) as (session, url):
        wrk_items(url, WARM_UP, c, ctx.name)
        return [
            {**window(session, lambda: wrk_items(url, n, c, ctx.name), url), "round": r}
            for r in range(1, ctx.args.rounds + 1)
        ]


def grpc(ctx: Context) -> list[dict[str, Any]]:
    port = free_port()
    target = f"127.0.0.1:{port}"

    def run(connections: int, seconds: float) -> int:
        result = grpc_load(target, ctx.name, connections, seconds)
        if result["errors"]:
            raise RuntimeError(f"gRPC calls failed: {result['statuses']}")
        return int(result["requests"])

    overrides = {"SERVING_GRPC_PORT": str(port), "SERVING_WORKER_CLASS": ctx.args.grpc_worker_class}
    with served(ctx, overrides) as (session, url):
        run(8, 2.0)
        return [
            {
                **window(session, lambda: run(ctx.args.connections, ctx.args.grpc_seconds), url),
                "round": r,
            }
            for r in range(1, ctx.args.rounds + 1)
        ]
