"""How bursts of new connections split between two gevent workers (fair accepting).

Each burst opens ``--clients`` connections at once (a barrier), each sending
one request to the probe handler (tests/handlers/probe), which answers with
its worker's pid; the split is how many each worker took. Without fair
accepting (``serving_core/process/workers/fairaccept.py``), a busy hub took 7
or 8 of 8 in 2 of 12 bursts, and with keep-alive those connections would have
stayed on it. With it, a worker that leads by more than one pauses, and
takes nothing more from the backlog in that wake-up (gevent's accept loop
would take up to 100 at once: a burst that reached the backlog before the
sibling woke went to one worker until that was cut), unless its sibling has
not taken its share within ``ACCEPT_PAUSE_MAX_S``. The mechanism is tested
deterministically in tests/process/test_greenworker.py; the split depends on
scheduling, so it is measured here.

    .venv/bin/python bench/fairaccept.py [--bursts 12] [--clients 8]
"""

from __future__ import annotations

import argparse
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bursts", type=int, default=12)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    env = {"SERVING_HANDLER": PROBE, "SERVING_WORKER_CLASS": "gevent", "SERVING_WORKERS": "2"}
    with gunicorn_server(env) as server:
        wait_for_worker_pids(server.url, 2)
        splits = [burst(server.url, args.clients) for _ in range(args.bursts)]
    for split in splits:
        print(" / ".join(map(str, split)) if len(split) == 2 else f"0 / {split[0]}")
    fair = sum(len(split) == 2 and split[0] >= args.clients // 2 - 1 for split in splits)
    print(f"{fair} of {len(splits)} bursts within one of an even split")


if __name__ == "__main__":
    main()
