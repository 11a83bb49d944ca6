"""Memory of a served MiniLM: PSS and USS of the master and each worker, preloaded or not.

PSS (proportional set size) splits each shared page among the processes that
map it, so the sum over master + workers is the service's real footprint; USS
(private pages) is what each process alone costs. Read from
``/proc/PID/smaps_rollup`` after each worker has answered requests.

    .venv/bin/python bench/memory.py [--workers 1 2 4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workload import SENTENCES  # noqa: E402
from tests.servers import base_env, free_port, gunicorn_server, stop  # noqa: E402

NO_PRELOAD = """
import os, sys
from serving_core.loading import load_handler
from serving_core.metrics.directory import enable_multiprocess
from serving_core.process.hooks import Hooks
from serving_core.process.options import gunicorn_options
from serving_core.process.server import ServingApplication, build
from serving_core.threads import set_worker_threads
from serving_core.settings import Settings

settings = Settings.from_env(os.environ)
enable_multiprocess("")

class EachWorkerLoads(ServingApplication):
    def load(self):
        # Runs in each worker after fork: every worker loads its own model.
        set_worker_threads(settings.workers)
        loaded = load_handler(settings.handler)
        loaded.handler.setup()
        app, service, _ = build(settings, loaded)
        service.start()
        return app

from types import SimpleNamespace
options = gunicorn_options(settings, Hooks(settings, SimpleNamespace()), "no-preload")
options.update(preload_app=False, post_fork=lambda server, worker: None,
               worker_exit=lambda server, worker: None)
EachWorkerLoads(None, options).run()
"""


def rollup(pid: int) -> dict[str, int]:
    values = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        values[name] = int(rest.split()[0])  # kB
    return values


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()]


def measure(master: int, url: str, workers: int) -> dict[str, Any]:
    session = requests.Session()
    for i in range(20 * workers):  # every worker answers some requests
        session.post(url + "/predict", json={"text": SENTENCES[i % len(SENTENCES)]}, timeout=60)
    time.sleep(1)
    procs = [master, *children(master)]
    rows = []
    for pid in procs:
        r = rollup(pid)
        rows.append(
            {
                "pid": pid,
                "pss_mb": r["Pss"] / 1024,
                "uss_mb": (r["Private_Clean"] + r["Private_Dirty"]) / 1024,
                "rss_mb": r["Rss"] / 1024,
            }
        )
    return {"workers": workers, "rows": rows, "pss_total_mb": sum(r["pss_mb"] for r in rows)}


def preloaded(workers: int) -> dict[str, Any]:
    with gunicorn_server({"SERVING_WORKERS": str(workers)}) as server:
        return measure(server.pid, server.url, workers)


def not_preloaded(workers: int) -> dict[str, Any]:
    port = free_port()
    env = base_env({"SERVING_WORKERS": str(workers), "SERVING_BIND": f"127.0.0.1:{port}"})
    process = subprocess.Popen(
        [sys.executable, "-c", NO_PRELOAD],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if (
                    requests.get(url + "/readyz", timeout=1).status_code == 200
                    and len(children(process.pid)) == workers
                ):
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        time.sleep(3 * workers)  # the other workers finish loading
        return measure(process.pid, url, workers)
    finally:
        stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = {}
    for workers in args.workers:
        for mode, run in (("preload", preloaded), ("no preload", not_preloaded)):
            result = run(workers)
            results[(mode, workers)] = result
            master, *rest = result["rows"]
            print(
                f"{mode:>10}, {workers} worker(s): total PSS {result['pss_total_mb']:7.1f} MB | "
                f"master PSS {master['pss_mb']:6.1f} USS {master['uss_mb']:6.1f} | workers PSS "
                + " ".join(f"{r['pss_mb']:.1f}" for r in rest)
                + " USS "
                + " ".join(f"{r['uss_mb']:.1f}" for r in rest)
                + " MB"
            )
    if ("preload", 1) in results and ("preload", 4) in results:
        one, four = results[("preload", 1)], results[("preload", 4)]
        print(
            f"preloaded, 4 workers / 1 worker total PSS: "
            f"{four['pss_total_mb'] / one['pss_total_mb']:.2f} (goal <= 1.3)"
        )
    if ("no preload", 4) in results and ("preload", 4) in results:
        ratio = results[("no preload", 4)]["pss_total_mb"] / results[("preload", 4)]["pss_total_mb"]
        print(f"4 workers, no preload / preload total PSS: {ratio:.2f}")


if __name__ == "__main__":
    main()
