"""``serving-core worker`` with MiniLM: jobs/s against the bare-model limit, and one job's latency.

Two measurements, on each backend (SQLite in a temporary directory; Redis
started on 127.0.0.1 by ``tests/redis_server.py``):

- throughput, in rounds: first, once, the bare model's best cell is picked
  (``Bare.select``: one process on every core and one process per core, each
  at batch 8, 16 and 32); the selection's figures are printed, never the
  limit: the best of six noisy cells is biased upward. In each round N
  sentences of ``workload.py`` are submitted straight into the queue
  (``open_queue(...).submit``, no HTTP), then ``serving-core worker`` started
  with the defaults (one consumer per core, max batch 16). The chosen cell is
  measured again interleaved with the run (``Bare.measure_cell``): once the
  worker is healthy, and after every ``--slice-s`` of its run, the worker's
  process group is stopped (SIGSTOP) while the cell runs alone, then
  continued; and once more at the end. This VM's speed drifts by 10-20% within
  a minute, so a limit measured only before and after a round (as this bench
  did until 2026-12-02) missed what the round itself saw. The rate is the jobs
  finished over the worker's running time, the limit the mean of the round's
  measurements, and the summary the median of the rounds' ratios. Goal: >= 0.9
  x the limit.
  Each round also prints the cores' worth of CPU that neither the worker nor
  this script used over it (from /proc): other load on a shared machine.
  Before each round and each latency run it waits until no pytest runs
  (``quiet.wait_quiet``), since other sessions run the suite here at times.
- latency at low load: one job at a time into an idle worker, the client
  polling ``get`` every millisecond; submit-to-done is from just before
  ``submit`` to the first ``get`` that reads ``done``. Printed next to the
  model time of one item (bare batch-1 on one torch thread, what a consumer
  has). Goal: p50 under 50 ms plus the model time.

    .venv/bin/python bench/jobs.py [--backends sqlite redis] [--jobs 2000] [--rounds 2]
        [--latency-jobs 50] [--seconds 3] [--slice-s 3] [--env SERVING_X=Y ...] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.bare_model import Bare  # noqa: E402
from bench.interleave import run_interleaved  # noqa: E402
from bench.quiet import wait_quiet  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from serving_core.jobs.backends import open_queue  # noqa: E402
from serving_core.jobs.base import JobQueue  # noqa: E402
from serving_core.settings import Settings  # noqa: E402
from tests.redis_server import redis_server  # noqa: E402
from tests.servers import job_worker  # noqa: E402

HANDLER = str(ROOT / "handlers/minilm/handler.py")
QUEUE = "all-minilm-l6-v2"  # the MiniLM handler's name: the queue its worker consumes
POLL_S = 0.001


@contextlib.contextmanager
def backend(name: str, folder: Path) -> Iterator[dict[str, str]]:
    """The worker's SERVING_ settings for a fresh, empty queue on ``name``."""
    if name == "sqlite":
        yield {"SERVING_JOBS_PATH": str(folder / f"jobs-{time.monotonic_ns()}.db")}
    elif name == "redis":
        with redis_server() as url:
            yield {"SERVING_JOBS_URL": url}
    else:
        raise SystemExit(f"unknown backend {name!r}: sqlite or redis")


def open_jobs(settings: Mapping[str, str]) -> JobQueue:
    return open_queue(Settings.from_env(dict(settings)), QUEUE)


def throughput(
    settings: dict[str, str], jobs: int, folder: Path, measure: Callable[[], float], slice_s: float
) -> dict[str, Any]:
    """The worker's jobs/s over its run, and the limit measured interleaved with it:
    every ``slice_s`` of the worker's run, its process group is stopped (SIGSTOP)
    while ``measure`` runs the bare cell, then continued. The rate counts only the
    worker's running time, and the limit is the mean of every measurement, so a
    drift of this VM's speed over the round weighs on both sides alike."""
    queue = open_jobs(settings)
    try:
        submit_started = time.monotonic()
        ids = [queue.submit({"text": SENTENCES[i % len(SENTENCES)]}).id for i in range(jobs)]
        submit_s = time.monotonic() - submit_started
        overrides = {"SERVING_HANDLER": HANDLER, **settings}
        with job_worker(overrides, folder) as (process, _, _):
            seen = run_interleaved(process.pid, measure, lambda: queue.depth() == 0, slice_s)
            finished = [queue.get(job_id) for job_id in ids]
    finally:
        queue.close()
    not_done = [j for j in finished if j is None or j.status != "done"]
    if not_done:
        raise RuntimeError(f"{len(not_done)} of {jobs} jobs did not end done: {not_done[:3]}")
    ends = [j.finished_at for j in finished if j is not None and j.finished_at is not None]
    healthy_at, (_, queue_empty_at) = seen.windows[0][0], seen.windows[-1]
    # The queue empties when its last jobs are taken; the run ends when they are done.
    last = max(ends)
    ran_s = seen.ran_s - queue_empty_at + last
    counted = sum(1 for end in ends if end >= healthy_at)
    busy, worker, own = seen.cpu
    return {
        "jobs": jobs,
        # Cores' worth of CPU that neither the worker nor this script used: other load.
        "other_cores": (busy - worker - own) / seen.ran_s,
        "worker_cores": worker / seen.ran_s,
        "submit_per_s": jobs / submit_s,
        "before_healthy": jobs - counted,
        "seconds": ran_s,
        "per_s": counted / ran_s,
        "limits": seen.limits,
    }


def latency(settings: dict[str, str], jobs: int, folder: Path) -> dict[str, Any]:
    queue = open_jobs(settings)
    samples = []
    try:
        with job_worker({"SERVING_HANDLER": HANDLER, **settings}, folder):
            for i in range(jobs + 3):
                started = time.perf_counter()
                job_id = queue.submit({"text": SENTENCES[i % len(SENTENCES)]}).id
                while True:
                    job = queue.get(job_id)
                    if job is not None and job.status in ("done", "failed"):
                        break
                    time.sleep(POLL_S)
                if job.status != "done":
                    raise RuntimeError(f"job {job_id} failed: {job.error}")
                if i >= 3:  # the first jobs warm the consumers up
                    samples.append(1000 * (time.perf_counter() - started))
    finally:
        queue.close()
    samples.sort()
    return {
        "jobs": jobs,
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "redis"])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latency-jobs", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=3.0, help="per bare-model cell")
    parser.add_argument(
        "--slice-s", type=float, default=3.0, help="the worker's run between two measurements"
    )
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y settings")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    results: dict[str, Any] = {}
    with Bare() as bare, tempfile.TemporaryDirectory(prefix="bench-jobs-") as tmp:
        folder = Path(tmp)
        wait_quiet()
        selection = bare.select(args.seconds)
        results["selection"] = selection.to_json()
        if not args.json:
            print(selection.describe(), flush=True)
        for name in args.backends:
            rounds = []
            for _ in range(args.rounds):
                waited_s = wait_quiet()
                with backend(name, folder) as settings:
                    run = throughput(
                        {**settings, **extra},
                        args.jobs,
                        folder,
                        lambda: bare.measure_cell(selection.cell, args.seconds),
                        args.slice_s,
                    )
                limit = statistics.mean(run["limits"])
                run.update(limit_per_s=limit, ratio=run["per_s"] / limit, waited_s=waited_s)
                rounds.append(run)
                if not args.json:
                    print(
                        f"{name:>6} round: {run['per_s']:7.1f} jobs/s over {run['seconds']:.1f} s "
                        f"({run['before_healthy']} done before /healthz), limit {limit:.1f}/s "
                        f"(the chosen cell, interleaved: "
                        f"{' / '.join(f'{x:.0f}' for x in run['limits'])}), "
                        f"ratio {run['ratio']:.3f}; worker {run['worker_cores']:.2f} cores, "
                        f"other load {run['other_cores']:.2f} cores; "
                        f"submitted at {run['submit_per_s']:.0f}/s",
                        flush=True,
                    )
            wait_quiet()
            model_ms = bare.batch1_ms(args.seconds)["one_thread"]
            with backend(name, folder) as settings:
                late = latency({**settings, **extra}, args.latency_jobs, folder)
            late["model_ms"] = model_ms
            ratios = [r["ratio"] for r in rounds]
            results[name] = {
                "rounds": rounds,
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "latency": late,
            }
            if not args.json:
                print(
                    f"{name:>6}: jobs/s / limit {statistics.median(ratios):.3f} "
                    f"({min(ratios):.3f}-{max(ratios):.3f}, goal >= 0.9); "
                    f"submit-to-done p50 {late['p50_ms']:.1f} ms, p99 {late['p99_ms']:.1f} ms "
                    f"over {late['jobs']} jobs; model time {model_ms:.2f} ms "
                    f"(goal p50 < {50 + model_ms:.1f} ms)",
                    flush=True,
                )
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
