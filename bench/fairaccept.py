"""How new connections split between two gevent workers (fair accepting).

Two measurements against one server running the probe handler
(tests/handlers/probe, which answers with its worker's pid):

- **Bursts**: ``--bursts`` times, ``--clients`` connections opened at once (a
  barrier), each sending one request; the split is how many each worker took.
  Without fair accepting (``serving_core/process/workers/fairaccept.py``), a
  busy hub took 7 or 8 of 8 in 2 of 12 bursts.
- **Keep-alive starts**: ``--starts`` times, ``wrk -c32`` starts against the
  busy server (1 s apart, as ``served.py``'s runs do) and, a second in, ``ss``
  counts each worker's established connections. With keep-alive a split
  stays for the whole run, and at c=32 it sets the batches: a worker with 17
  of 32 runs batches of 16 and 1 (``SERVING_MAX_BATCH_SIZE=16``) while its
  sibling's model waits for 15. With "an equal share plus one" as the bound,
  13 of 20 starts split 15/17; with the exact share, 20 of 20 split 16/16.

A worker that is full (one more connection would put it above an equal share
of all those open, rounded up) takes nothing from the backlog (gevent's accept
loop would take up to 100 at once), unless its sibling has not taken what is
pending within ``ACCEPT_PAUSE_MAX_S``. The mechanism is tested
deterministically in tests/process/test_greenworker.py; the split depends on
scheduling, so it is measured here.

    .venv/bin/python bench/fairaccept.py [--bursts 12] [--clients 8] [--starts 20]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.workload import SENTENCES  # noqa: E402
from tests.servers import gunicorn_server, wait_for_worker_pids  # noqa: E402

PROBE = str(ROOT / "tests" / "handlers" / "probe" / "handler.py")


def burst(url: str, clients: int) -> list[int]:
    """One burst: how many of its new connections each worker took, fewest first."""
    barrier = threading.Barrier(clients)

    def client(_: int) -> int:
        barrier.wait()
        with requests.Session() as session:
            body = {"text": "burst", "sleep_s": 0.01}
            return int(session.post(url + "/predict", json=body, timeout=30).json()["pid"])

    with ThreadPoolExecutor(clients) as pool:
        pids = list(pool.map(client, range(clients)))
    return sorted(pids.count(pid) for pid in set(pids))


def established(port: int) -> list[int]:
    """Each serving process's established connections on ``port`` (``ss``), fewest first."""
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    per_pid = collections.Counter(re.findall(r"pid=(\d+)", out))
    return sorted(per_pid.values())


def keepalive_start(url: str, sentences: str, connections: int) -> list[int]:
    """One ``wrk`` start: how its keep-alive connections split, a second into its run."""
    env = dict(os.environ, WRK_SENTENCES=sentences)
    lua = str(ROOT / "bench" / "post.lua")
    command = ["wrk", "-t2", f"-c{connections}", "-d2s", "-s", lua, url]
    with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL) as load:
        time.sleep(1.0)
        split = established(int(url.rsplit(":", 1)[1]))
        load.wait(30)
    return split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bursts", type=int, default=12)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--starts", type=int, default=20, help="wrk -c32 starts (0: none)")
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    if args.starts and not (shutil.which("wrk") and shutil.which("ss")):
        raise SystemExit("the keep-alive starts need wrk and ss: apt-get install wrk iproute2")
    env = {"SERVING_HANDLER": PROBE, "SERVING_WORKER_CLASS": "gevent", "SERVING_WORKERS": "2"}
    with gunicorn_server(env) as server:
        wait_for_worker_pids(server.url, 2)
        splits = [burst(server.url, args.clients) for _ in range(args.bursts)]
        starts = []
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as sentences:
            sentences.write("\n".join(SENTENCES))
            sentences.flush()
            for _ in range(args.starts):
                time.sleep(1.0)
                starts.append(keepalive_start(server.url, sentences.name, args.connections))
    print(f"bursts of {args.clients} new connections, one request each:")
    for split in splits:
        print("  " + (" / ".join(map(str, split)) if len(split) == 2 else f"0 / {split[0]}"))
    fair = sum(len(split) == 2 and split[0] >= args.clients // 2 - 1 for split in splits)
    print(f"{fair} of {len(splits)} bursts within one of an even split")
    if starts:
        tally = collections.Counter(" / ".join(map(str, start)) for start in starts)
        print(f"wrk -c{args.connections} starts, keep-alive connections per worker:")
        for shown, count in tally.most_common():
            print(f"  {shown}: {count} of {len(starts)}")


if __name__ == "__main__":
    main()
