"""The consumers' own CPU per item: ``serving-core stream`` and ``serving-core worker``
with a model that costs next to nothing (``consumer_cpu_handler.py``: batched, 384
float32s an item, as MiniLM answers), so what the worker's processes spend is the
framework's: decoding, the broker client, publishing, acking, metrics. CPU seconds
from /proc (utime + stime of every process in the worker's session) over a round of
``--messages`` items, divided by them: µs per item. A throughput ratio on a shared
machine is noise; this figure is not (much).

    PYTHONPATH=$PWD .venv/bin/python bench/consumer_cpu.py [--paths redis amqp kafka sqlite]
        [--messages 4000] [--rounds 3] [--profile SECONDS]
        [--handler embedding|accelerator|echo|minilm]

``--handler accelerator`` stands for a GPU: each batch takes ``BENCH_BATCH_MS`` (20)
off the CPU, so the items/s printed show whether the consumer keeps the model busy
(at most SERVING_MAX_BATCH_SIZE x consumers every that many ms).

``--handler minilm`` serves the real model: its µs per item less the bare model's
(``bare_minilm_us``, printed with it) is the framework's share plus however much
slower the model runs in a consumer than alone.

``--profile`` runs ``py-spy record`` on one consumer for that long during the first
round and writes its collapsed stacks to $TMPDIR/consumer_cpu-PATH.txt (``SPY_ARGS=--gil``
adds py-spy options).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.interleave import session_cpu_s  # noqa: E402
from bench.results import Results  # noqa: E402
from bench.stream import BROKERS  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from serving_core.jobs.backends import open_queue  # noqa: E402
from serving_core.settings import Settings  # noqa: E402
from tests.servers import free_port, job_worker, spawn, stop, wait_for  # noqa: E402

# A handler and the queue its worker consumes (its name). The default, embedding, is
# batched and answers 384 float32s an item, as MiniLM does, at next to no cost; echo is
# unbatched (a batch of one each); hashembed costs tens of µs an item of its own.
NATIVE = os.environ.get("SPY_ARGS", "").split()
# Any SERVING_ setting of this script's environment goes to the worker too.
EXTRA = {k: v for k, v in os.environ.items() if k.startswith("SERVING_")}
HANDLERS = {
    "embedding": ("bench/consumer_cpu_handler.py:Embedding", "embedding"),
    "accelerator": ("bench/consumer_cpu_handler.py:Accelerator", "accelerator"),
    "echo": ("handlers/echo/handler.py", "echo"),
    "hashembed": ("handlers/hashembed/handler.py", "hash-embedding"),
    "minilm": ("handlers/minilm/handler.py", "all-minilm-l6-v2"),
}


def body(i: int) -> bytes:
    return json.dumps({"text": SENTENCES[i % len(SENTENCES)]}).encode()


BARE = """
import json, resource, sys, time
import torch
from serving_core.loading import load_handler
from bench.workload import SENTENCES
torch.set_num_threads(1)
handler = load_handler(sys.argv[1]).handler
handler.setup()
batches = [[{"text": SENTENCES[(i + j) % len(SENTENCES)]} for j in range(16)]
           for i in range(0, len(SENTENCES), 16)]
handler.predict_batch(batches[0])
n, start = 0, resource.getrusage(resource.RUSAGE_SELF)
while n < int(sys.argv[2]):
    handler.predict_batch(batches[(n // 16) % len(batches)])
    n += 16
end = resource.getrusage(resource.RUSAGE_SELF)
used = end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime
print(json.dumps(used / n * 1e6))
"""


def bare_us(handler: str, items: int) -> float:
    """The handler's own CPU µs per item, alone in a process on one torch thread, in
    batches of 16 (a consumer's defaults)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(
        [sys.executable, "-c", BARE, str(ROOT / handler), str(items)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return float(out.stdout.strip().splitlines()[-1])


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def process_cpu_s(pid: int) -> float:
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def measured(
    session: int, count: int, start: Callable[[], None], done: Callable[[], bool]
) -> float:
    """µs of the session's CPU per item, from just before ``start`` to ``done`` (and,
    printed, the master's share: the session's first process)."""
    before, master = session_cpu_s(session), process_cpu_s(session)
    began = time.perf_counter()
    start()
    while not done():
        time.sleep(0.02)
    rate = count / (time.perf_counter() - began)
    master = process_cpu_s(session) - master
    print(
        f"    {rate:.0f} items/s; the master's CPU: {master / count * 1e6:.0f} µs/item", flush=True
    )
    return (session_cpu_s(session) - before) / count * 1e6


def reached(results: Results, target: int) -> bool:
    return results.count() >= target


def stop_unlocked(group: int, path: str) -> None:
    """SIGSTOP the worker at a moment none of its processes holds the SQLite write lock."""
    while True:
        os.killpg(group, signal.SIGSTOP)
        probe = sqlite3.connect(path, timeout=0.1, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.killpg(group, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            probe.close()


def profile(pid: int, seconds: float, name: str) -> subprocess.Popen[bytes]:
    out = Path(tempfile.gettempdir()) / f"consumer_cpu-{name}.txt"
    print(f"  profiling consumer {pid} into {out} (py-spy raw, collapsed stacks)", flush=True)
    command = [
        str(Path(sys.executable).parent / "py-spy"),
        "record",
        "-r",
        "250",
        "-d",
        str(round(seconds)),
        "-p",
        str(pid),
    ]
    return subprocess.Popen(
        [*command, "-f", "raw", "-o", str(out)],
    )


def stream_rounds(backend: str, args: argparse.Namespace) -> list[float]:
    with BROKERS[backend]() as broker, tempfile.TemporaryDirectory() as tmp:
        env = {
            "SERVING_HANDLER": str(ROOT / HANDLERS[args.handler][0]),
            "SERVING_BIND": f"127.0.0.1:{free_port()}",
            "SERVING_METRICS_DIR": str(Path(tmp) / "metrics"),
            "SERVING_STREAM_SOURCE": broker.source_url,
            "SERVING_STREAM_SINK": broker.sink_url,
            "SERVING_STREAM_DEAD_LETTER": broker.dead_url,
            **EXTRA,
        }
        log = Path(tmp) / "stream.log"
        results = Results(backend, broker)
        process = spawn("stream", env, log)
        try:
            broker.produce([(f"warm-{i}", body(i), {}) for i in range(200)])
            wait_for(lambda: results.count() >= 200, lambda: log.read_text()[-3000:], 120)
            figures = []
            for round_ in range(args.rounds):
                items: list[tuple[str, bytes, dict[str, str]]] = [
                    (f"r{round_}-{i}", body(i), {}) for i in range(args.messages)
                ]
                target = 200 + (round_ + 1) * args.messages
                spy = None
                if args.profile and round_ == 0:
                    spy = profile(children(process.pid)[0], args.profile, backend)
                # Produced while measured: the producer is this script, not the worker's
                # session, so its CPU is not counted.
                figures.append(
                    measured(
                        process.pid,
                        args.messages,
                        functools.partial(broker.produce, items),
                        functools.partial(reached, results, target),
                    )
                )
                if spy is not None:
                    spy.wait()
                print(f"  {backend} round {round_ + 1}: {figures[-1]:.0f} µs/item", flush=True)
            return figures
        finally:
            results.close()
            stop(process)


def jobs_rounds(args: argparse.Namespace) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        handler, name = HANDLERS[args.handler]
        settings = {
            "SERVING_JOBS_PATH": str(Path(tmp) / "jobs.db"),
            "SERVING_HANDLER": str(ROOT / handler),
            **EXTRA,
        }
        queue = open_queue(Settings.from_env(settings), name)
        try:
            with job_worker(settings, Path(tmp)) as (process, _, _):
                figures = []
                for round_ in range(args.rounds):
                    # Submitted with the worker stopped (not holding the file's write
                    # lock): the round starts with a full queue, so the consumers take
                    # whole batches, as under load, not the trickle of the submits.
                    stop_unlocked(process.pid, settings["SERVING_JOBS_PATH"])
                    texts = [SENTENCES[i % len(SENTENCES)] for i in range(args.messages)]
                    ids = [queue.submit({"text": text}).id for text in texts]
                    spy = None
                    if args.profile and round_ == 0:
                        spy = profile(children(process.pid)[0], args.profile, "sqlite")

                    def finished(ids: list[str] = ids) -> bool:
                        job = queue.get(ids[-1])
                        return queue.depth() == 0 and job is not None and job.status == "done"

                    figures.append(
                        measured(
                            process.pid,
                            args.messages,
                            lambda: os.killpg(process.pid, signal.SIGCONT),
                            finished,
                        )
                    )
                    if spy is not None:
                        spy.wait()
                    print(f"  sqlite round {round_ + 1}: {figures[-1]:.0f} µs/item", flush=True)
                return figures
        finally:
            queue.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", nargs="+", default=["redis", "amqp", "kafka", "sqlite"])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--handler", choices=sorted(HANDLERS), default="embedding")
    args = parser.parse_args()
    summary: dict[str, Any] = {}
    for path in args.paths:
        figures = jobs_rounds(args) if path == "sqlite" else stream_rounds(path, args)
        summary[path] = {"median_us": statistics.median(figures), "rounds": figures}
    if args.handler == "minilm":
        bare = [bare_us(HANDLERS["minilm"][0], args.messages) for _ in range(2)]
        summary["bare_minilm_us"] = {"median_us": statistics.median(bare), "rounds": bare}
    for path, s in summary.items():
        rounds = " / ".join(f"{x:.0f}" for x in s["rounds"])
        print(f"{path:>8}: {s['median_us']:6.0f} µs/item (rounds {rounds})")


if __name__ == "__main__":
    main()
