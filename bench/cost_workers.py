"""The worker paths of ``framework_cost.py``: ``serving-core worker`` (jobs), ``serving-core
stream`` and ``serving-core batch``. Same rows as ``cost_paths.py``'s."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.cost_paths import WARM_UP, Context, answers, wait_until, window
from bench.interleave import busy_s
from bench.proc_cpu import listener_pid
from bench.results import Results
from bench.stream import BROKERS, messages, worker_env
from tests.redis_server import redis_server
from tests.servers import SERVING_CORE, free_port, stop

# serving-core batch's records per --items: with a fast model the command is so cheap
# (~20 us a record with handlers/echo) that --items records are a few clock ticks of CPU.
BATCH_SCALE = 10

# Run by the tree's Python (PYTHONPATH): submits jobs straight into the queue, as
# jobs.py does, and answers "done" once every one is done; outside the window's session.
SUBMITTER = """
import json, sys, time
try:
    from serving_core.jobs.backends import open_queue
except ImportError:  # trees before 2026-12-02 named the module backend
    from serving_core.jobs.backend import open_queue
from serving_core.settings import Settings
queue = open_queue(Settings.from_env(json.loads(sys.argv[1])), sys.argv[2])
print("ready", flush=True)
for line in sys.stdin:
    prefix, count = line.split()
    ids = [queue.submit({"text": f"The quarterly report, copy {i} of {prefix}."}).id
           for i in range(int(count))]
    for job_id in ids:
        while (job := queue.get(job_id)) is None or job.status not in ("done", "failed"):
            time.sleep(0.01)
        if job.status != "done":
            raise SystemExit(f"job {job_id} failed: {job.error}")
    print("done", flush=True)
"""


def jobs(backend: str) -> Callable[[Context], list[dict[str, Any]]]:
    def path(ctx: Context) -> list[dict[str, Any]]:
        with contextlib.ExitStack() as stack:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="framework-cost-")))
            broker = None
            if backend == "redis":
                redis_url = stack.enter_context(redis_server())
                settings = {"SERVING_JOBS_URL": redis_url}
                broker = listener_pid(urlsplit(redis_url).port or 6379)
            else:
                settings = {"SERVING_JOBS_PATH": str(tmp / "jobs.db")}
            submitter = subprocess.Popen(
                [sys.executable, "-c", SUBMITTER, json.dumps(settings), ctx.name],
                cwd="/",
                env=ctx.env({}),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            stack.callback(submitter.wait, 30)
            stack.callback(submitter.kill)
            assert submitter.stdin is not None
            assert submitter.stdout is not None
            if submitter.stdout.readline().strip() != "ready":
                raise RuntimeError("the job submitter did not start (its error is above)")

            def submit(prefix: str, count: int) -> int:
                submitter.stdin.write(f"{prefix} {count}\n")
                submitter.stdin.flush()
                if submitter.stdout.readline().strip() != "done":
                    raise RuntimeError("the job submitter stopped (its error is above)")
                return count

            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log = tmp / "worker.log"
            env = {"SERVING_HANDLER": ctx.handler, "SERVING_BIND": f"127.0.0.1:{port}", **settings}
            process = ctx.start("worker", env, log)
            stack.callback(stop, process)
            wait_until(lambda: answers(url + "/healthz"), process, log)
            submit("warm", WARM_UP)
            return [
                {
                    **window(process.pid, lambda r=r: submit(f"r{r}", ctx.args.items), url, broker),
                    "round": r,
                }
                for r in range(1, ctx.args.rounds + 1)
            ]

    return path


def stream(backend: str) -> Callable[[Context], list[dict[str, Any]]]:
    def path(ctx: Context) -> list[dict[str, Any]]:
        with BROKERS[backend]() as broker, tempfile.TemporaryDirectory() as tmp:
            env = worker_env(broker, Path(tmp), ctx.handler)
            url = f"http://{env['SERVING_BIND']}"
            broker_pid = listener_pid(urlsplit(broker.source_url).port or 0)
            results = Results(backend, broker)
            log = Path(tmp) / "stream.log"
            process = ctx.start("stream", env, log)
            seen = 0

            def put(prefix: str, count: int) -> int:
                nonlocal seen
                broker.produce(messages(prefix, count))
                seen += count
                wait_until(lambda: results.count() >= seen, process, log)
                return count

            try:
                put("warm", WARM_UP)
                return [
                    {
                        **window(
                            process.pid, lambda r=r: put(f"r{r}", ctx.args.items), url, broker_pid
                        ),
                        "round": r,
                    }
                    for r in range(1, ctx.args.rounds + 1)
                ]
            finally:
                results.close()
                stop(process)

    return path


def batch(ctx: Context) -> list[dict[str, Any]]:
    """``serving-core batch`` over 1 record and over ``--items``: the difference, so that
    its start-up (imports, the handler's setup, forking) is left out. Its CPU is its
    own and its forked workers' (it waits for them), from ``wait4``."""
    with tempfile.TemporaryDirectory(prefix="framework-cost-") as tmp:

        def run(count: int) -> tuple[float, float, float]:
            """(CPU, wall and machine-busy seconds) of one batch run over ``count`` records."""
            source, output = Path(tmp) / f"in-{count}.jsonl", Path(tmp) / "out.jsonl"
            with source.open("w") as file:
                for i in range(count):
                    file.write(json.dumps({"id": i, "text": f"The report, copy {i}."}) + "\n")
            output.unlink(missing_ok=True)
            command = [str(SERVING_CORE), "batch", "--handler", ctx.handler]
            log = Path(tmp) / "batch.log"
            wall, busy = time.monotonic(), busy_s()
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [*command, "--input", str(source), "--output", str(output)],
                    cwd=ctx.tree,
                    env=ctx.env({}),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            # wait4: this child's rusage and its waited workers', not every child of this
            # script reaped meanwhile (subprocess reaps finished ones on each Popen).
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            wall, busy = time.monotonic() - wall, busy_s() - busy
            if process.returncode != 0:
                raise RuntimeError(f"serving-core batch failed:\n{log.read_text()[-3000:]}")
            cpu = usage.ru_utime + usage.ru_stime
            return cpu, wall, busy

        n = BATCH_SCALE * ctx.args.items
        run(1)  # the page cache, the first imports
        rows = []
        for round_ in range(1, ctx.args.rounds + 1):
            (cpu, wall, busy), (cpu_1, wall_1, busy_1) = run(n), run(1)
            cpu, wall, busy = cpu - cpu_1, wall - wall_1, busy - busy_1
            rest = (busy - cpu) / wall
            row = {"items": n - 1, "cpu_s": cpu, "wall_s": wall, "rest_cores": rest}
            rows.append({**row, "batch": None, "round": round_})
        return rows
