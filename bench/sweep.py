"""What sweeping out hung-up clients before a refusal costs (``Batcher._refuse``).

A microbenchmark (CPU time of the calling thread, so that a loaded machine
times the same) on one worker's batcher, its model held so that the queue
stays full (``--max-queue``, the default SERVING_MAX_QUEUE for batches of 32):

- a refusal when every queued client still waits: the sweep is skipped after
  one integer check (no marks), so this is the refusal's own cost;
- a hang-up marked (``hung_up``, what the client watch calls on the hub);
- a newcomer admitted after the whole queue hung up: the sweep, then the
  decision again;
- a refusal that first asks every queued client's socket whether it hung up
  (``WaitQueue.peek``, a ``recv(MSG_PEEK | MSG_DONTWAIT)`` on each of a queue of
  live socket pairs): at most one refusal in ``PEEK_EVERY_S`` pays it.

Then what refusing costs at ``--overload`` x a capacity of ``--capacity``
requests/s (the c=32 figure of bench/README.md): every request beyond capacity
is refused, each paying the first, and a peek every ``PEEK_EVERY_S``.

    .venv/bin/python bench/sweep.py [--max-queue 64] [--rounds 5] [--capacity 400] [--overload 10]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serving_core.context import Context  # noqa: E402
from serving_core.engine.batcher import Batcher  # noqa: E402
from serving_core.engine.engine import Ran  # noqa: E402
from serving_core.engine.pending import Pending  # noqa: E402
from serving_core.engine.policy import make_policy  # noqa: E402
from serving_core.engine.waitqueue import PEEK_EVERY_S  # noqa: E402
from serving_core.errors import Overloaded  # noqa: E402
from serving_core.process.workers.clientwatch import peek_hangup  # noqa: E402


def held_batcher(max_queue: int, gate: threading.Event) -> Batcher:
    entered = threading.Event()

    def run(items: Any, contexts: Any) -> Ran:
        entered.set()
        gate.wait()
        return Ran([{} for _ in items], 1)

    batcher = Batcher(
        run,
        policy=make_policy("adaptive", max_batch_size=1, max_wait_ms=5),
        max_batch_size=1,
        max_queue=max_queue,
    )
    batcher.start()
    submit(batcher, "running")
    entered.wait(5)
    return batcher


def submit(batcher: Batcher, item: str) -> Pending:
    now = time.monotonic()
    return batcher.submit(item, Context(item, now + 60), arrival=now)


def fill(batcher: Batcher, max_queue: int) -> list[Pending]:
    return [submit(batcher, f"q{n}") for n in range(max_queue - batcher.depth)]


def refusal_s(batcher: Batcher, times: int, *, peek: bool = False) -> float:
    """Seconds per refusal in front of a full queue of live clients; ``peek``: each
    one asks the queued clients' sockets first (due every time)."""
    deadline = time.monotonic() + 60
    started = time.thread_time()
    for _ in range(times):
        if peek:
            batcher._queue.peeked_at = float("-inf")
        try:
            batcher.admit(deadline)
        except Overloaded:
            pass
        else:
            raise AssertionError("a full queue of live clients admitted a request")
    return (time.thread_time() - started) / times


def sweep_s(batcher: Batcher, max_queue: int) -> tuple[float, float]:
    """(seconds per hung_up mark, seconds for the admission that sweeps them all)."""
    queued = fill(batcher, max_queue)
    started = time.thread_time()
    for pending in queued:
        batcher.hung_up(pending)
    marked = (time.thread_time() - started) / len(queued)
    started = time.thread_time()
    batcher.admit(time.monotonic() + 60)
    return marked, time.thread_time() - started


def peek_s(batcher: Batcher, max_queue: int, times: int) -> float:
    """Seconds for a refusal that asks each of a full queue of live clients first."""
    pairs = [socket.socketpair() for _ in range(max_queue)]
    try:
        for pending, (server, _) in zip(fill(batcher, max_queue), pairs, strict=False):
            pending.client_gone = lambda server=server: bool(peek_hangup(server))
        return refusal_s(batcher, times, peek=True)
    finally:
        for pair in pairs:
            for sock in pair:
                sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--refusals", type=int, default=20000)
    parser.add_argument("--capacity", type=float, default=400.0)
    parser.add_argument("--overload", type=float, default=10.0)
    args = parser.parse_args()
    gate = threading.Event()
    batcher = held_batcher(args.max_queue, gate)
    try:
        fill(batcher, args.max_queue)
        refusals = [refusal_s(batcher, args.refusals) for _ in range(args.rounds)]
    finally:
        gate.set()
        batcher.stop(5)
    peeks = []
    for _ in range(args.rounds):
        gate = threading.Event()
        batcher = held_batcher(args.max_queue, gate)
        try:
            peeks.append(peek_s(batcher, args.max_queue, 2000))
        finally:
            gate.set()
            batcher.stop(5)
    sweeps = []
    for _ in range(args.rounds):
        gate = threading.Event()
        batcher = held_batcher(args.max_queue, gate)
        try:
            sweeps.append(sweep_s(batcher, args.max_queue))
        finally:
            gate.set()
            batcher.stop(5)
    refusal = statistics.median(refusals)
    marked = statistics.median(mark for mark, _ in sweeps)
    swept = statistics.median(sweep for _, sweep in sweeps)
    peek = statistics.median(peeks)
    per_s = args.capacity * (args.overload - 1)
    peeks_per_s = min(per_s, 1 / PEEK_EVERY_S)
    print(f"queue of {args.max_queue}, {args.rounds} rounds, medians")
    print(f"refusal, a full queue of live clients: {refusal * 1e6:.2f} us")
    print(f"hung_up mark: {marked * 1e6:.2f} us")
    print(f"admission that sweeps {args.max_queue} hung-up items: {swept * 1e6:.1f} us")
    print(f"refusal that first peeks at {args.max_queue} live clients: {peek * 1e6:.1f} us")
    busy = per_s * refusal + peeks_per_s * (peek - refusal)
    print(
        f"at {args.overload:g}x of {args.capacity:g} req/s: {per_s:.0f} refusals/s, "
        f"{peeks_per_s:.0f} of them peeking: {busy * 100:.2f}% of a core"
    )


if __name__ == "__main__":
    main()
