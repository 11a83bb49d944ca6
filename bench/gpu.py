"""MiniLM on a GPU: the bare-model limit, then served throughput, with the image's Python alone.

Needs only what a serving-core image holds (the standard library, torch,
transformers, serving-core and its handler): no wrk, no repository checkout,
no network. Mount this one file into the CUDA image and run it:

    docker run --rm --gpus all -v "$PWD/bench:/bench:ro" IMAGE:1.2.3-cu128 \
        python /bench/gpu.py
    python bench/gpu.py --device cpu --dtype float32 --seconds 2 \
        --workers 1 --concurrency 4 --batch 1 8      # a CPU dry run of the same path

1. **Bare limit**, in a child process (so its CUDA context is gone before the
   server starts): the handler's own ``predict_batch`` at each batch size, its
   tokenizer alone where it has one, sentences/s.
2. **Served**, for each model-process mode (``SERVING_MODEL_PROCESS``:
   per-worker, a model copy and CUDA context in every worker; shared, one
   model process fed by every worker) and worker count: ``serving-core
   serve`` on 127.0.0.1 with ``SERVING_DEVICE``/``SERVING_DTYPE``, driven
   closed-loop at each concurrency by load processes of keep-alive
   ``http.client`` connections: req/s, p50 / p99, the mean batch the model
   ran (from ``/metrics``), and GPU busy % where ``nvidia-smi`` exists.
3. **The no-op ceiling** (``--noop``, on by default): the echo handler in the
   same server, at each worker count: what the HTTP layer alone can serve on
   these cores. Every figure is printed as one JSON line too.

The issue's run on an H200 with 16 cores (the defaults): workers 8 and 16,
c=256, both modes and the ceiling. Goal: shared ≥ 12,000 req/s at p99 ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

WORDS = [
    *("the", "model", "serves", "sentences", "in", "batches", "on", "one", "device"),
    *("while", "many", "workers", "parse", "requests", "tokenise", "text", "and"),
    *("answer", "clients", "quickly", "under", "load", "with", "deadlines"),
]


def sentences(count: int) -> list[str]:
    """Deterministic sentences of 6-30 words: short and long requests mixed, as traffic is."""
    return [
        " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6 + (i * 5) % 25))
        for i in range(count)
    ]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- 1. the bare model --------------------------------------------------------


def bare(args: argparse.Namespace) -> list[dict[str, Any]]:
    from serving_core.loading import load_handler

    loaded = load_handler(args.handler, device=args.device, dtype=args.dtype)
    handler: Any = loaded.handler
    handler.setup()
    handler.setup_worker()
    texts = sentences(max(args.batch))
    rows = []
    for size in args.batch:
        # What the workers send it: a handler that tokenises in preprocess off the CPU
        # (handlers/minilm) does it where the requests run, not in the model's process.
        batch = [handler.preprocess({"text": text}) for text in texts[:size]]
        for _ in range(5):  # warm: TorchScript's profiling runs, cuDNN/cuBLAS choices, allocator
            handler.predict_batch(batch)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            handler.predict_batch(batch)  # returns host arrays: the GPU has finished
            done += size
        elapsed = time.perf_counter() - start
        row: dict[str, Any] = {
            "measure": "bare",
            "device": getattr(handler, "runs_on", args.device),
            "dtype": args.dtype,
            "batch": size,
            "sentences_per_s": round(done / elapsed, 1),
            "batch_ms": round(1000 * elapsed * size / done, 2),
        }
        tokenizer = getattr(handler, "tokenizer", None)
        if tokenizer is not None:
            plain = texts[:size]
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < min(args.seconds, 2.0):
                tokenizer(plain, padding=True, truncation=True, return_tensors="pt")
                calls += 1
            row["tokenize_ms"] = round(1000 * (time.perf_counter() - start) / calls, 2)
        rows.append(row)
    return rows


# -- 2. served ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except OSError as exc:
        return getattr(exc, "code", 0) or 0, ""


@contextlib.contextmanager
def server(
    args: argparse.Namespace, workers: int, mode: str = "per-worker", handler: str = ""
) -> Any:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SERVING_")}
    env.update(
        SERVING_HANDLER=handler or args.handler,
        SERVING_MODEL_PROCESS=mode,
        # The answers repeat sentences: the inference cache would answer them.
        SERVING_CACHE_SIZE="0",
        SERVING_BIND=f"127.0.0.1:{port}",
        SERVING_WORKERS=str(workers),
        SERVING_DEVICE=args.device,
        SERVING_DTYPE=args.dtype,
        SERVING_MAX_BATCH_SIZE=str(args.max_batch),
        SERVING_MAX_QUEUE=str(4 * args.max_batch),
        SERVING_REQUEST_TIMEOUT_S="30",
        SERVING_LOG_LEVEL="warning",
        TOKENIZERS_PARALLELISM="false",
    )
    logfile = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    # The serving-core beside this Python (a venv's bin/), else the one on PATH (an image).
    command = Path(sys.executable).parent / "serving-core"
    process = subprocess.Popen(
        [str(command) if command.exists() else "serving-core", "serve"],
        env=env,
        stdout=logfile,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + args.start_timeout_s
        while get(url + "/readyz")[0] != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                logfile.seek(0)
                raise SystemExit(f"the server did not start:\n{logfile.read().decode()[-4000:]}")
            time.sleep(0.5)
        yield url, port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        logfile.close()


def client_process(  # noqa: PLR0917 (a multiprocessing target takes positional args)
    port: int, connections: int, start_at: float, stop_at: float, seed: int, out: Any
) -> None:
    """``connections`` threads, each one keep-alive connection in a closed loop."""
    import threading

    texts = sentences(512)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()

    def loop(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine: list[float] = []
        seen: dict[int, int] = {}
        i = seed * 1000 + index
        while time.time() < start_at:
            time.sleep(0.001)
        while (now := time.time()) < stop_at:
            body = json.dumps({"text": texts[i % len(texts)]})
            i += 7
            try:
                conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                status = 0
            seen[status] = seen.get(status, 0) + 1
            if status == 200:
                mine.append(time.time() - now)
        with lock:
            latencies.extend(mine)
            for status, count in seen.items():
                statuses[status] = statuses.get(status, 0) + count

    threads = [threading.Thread(target=loop, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.send((latencies, statuses))
    out.close()


def batch_totals(url: str) -> tuple[float, float]:
    """serving_batch_size's sum and count: the mean batch over an interval is their delta."""
    _, text = get(url + "/metrics", 10.0)
    found = dict.fromkeys(("sum", "count"), 0.0)
    for kind in found:
        for match in re.finditer(rf"^serving_batch_size_{kind}(?:{{[^}}]*}})? (\S+)$", text, re.M):
            found[kind] += float(match.group(1))
    return found["sum"], found["count"]


def gpu_busy_sampler() -> subprocess.Popen[str] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    return subprocess.Popen(
        [
            "nvidia-smi",
            "--query-gpu=utilization.gpu",
            "--format=csv,noheader,nounits",
            "-lms",
            "250",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def load(url: str, port: int, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    procs = max(1, min(args.load_processes, concurrency))
    shares = [concurrency // procs + (n < concurrency % procs) for n in range(procs)]
    start_at = time.time() + 1.0
    stop_at = start_at + args.seconds
    context = multiprocessing.get_context("fork")
    pipes, children = [], []
    for n, share in enumerate(shares):
        receive, send = context.Pipe(duplex=False)
        child = context.Process(
            target=client_process, args=(port, share, start_at, stop_at, n, send)
        )
        child.start()
        pipes.append(receive)
        children.append(child)
    time.sleep(max(0.0, start_at - time.time()))
    batch_sum, batch_count = batch_totals(url)
    sampler = gpu_busy_sampler()
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    for receive in pipes:
        mine, seen = receive.recv()
        latencies.extend(mine)
        for status, count in seen.items():
            statuses[status] = statuses.get(status, 0) + count
    for child in children:
        child.join()
    busy = None
    if sampler is not None:
        sampler.terminate()
        samples = [float(v) for v in (sampler.communicate()[0] or "").split() if v.strip()]
        busy = round(statistics.mean(samples), 1) if samples else None
    after_sum, after_count = batch_totals(url)
    latencies.sort()

    def pct(q: float) -> float | None:
        return round(1000 * latencies[int(q * (len(latencies) - 1))], 2) if latencies else None

    ran = after_count - batch_count
    return {
        "req_per_s": round(len(latencies) / args.seconds, 1),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "mean_batch": round((after_sum - batch_sum) / ran, 1) if ran else None,
        "gpu_busy_pct": busy,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
    }


def served(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = [(mode, args.handler) for mode in args.modes]
    if args.noop:
        runs.append(("noop", args.noop_handler))
    rows = []
    for mode, handler in runs:
        for workers in args.workers:
            server_mode = "per-worker" if mode == "noop" else mode
            with server(args, workers, server_mode, handler) as (url, port):
                load(url, port, min(args.concurrency), args)  # warm every worker
                for concurrency in args.concurrency:
                    row = {
                        "measure": "served",
                        "mode": mode,
                        "device": args.device,
                        "dtype": args.dtype,
                        "workers": workers,
                        "concurrency": concurrency,
                        "max_batch": args.max_batch,
                        **load(url, port, concurrency, args),
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(str(row.get(key, "")) for key in keys) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", choices=["all", "bare", "served"], default="all")
    parser.add_argument(
        "--handler", default=os.environ.get("SERVING_HANDLER", "handlers/minilm/handler.py")
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[256])
    parser.add_argument(
        "--modes", nargs="+", choices=["per-worker", "shared"], default=["per-worker", "shared"]
    )
    parser.add_argument("--noop", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--noop-handler", default="handlers/echo/handler.py")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--load-processes", type=int, default=max(1, (os.cpu_count() or 4) // 4))
    parser.add_argument("--start-timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if args.part == "bare":
        for row in bare(args):
            print(json.dumps(row), flush=True)
        return
    bare_rows: list[dict[str, Any]] = []
    if args.part == "all":
        log("bare model (in a child process) ...")
        same = ["--handler", args.handler, "--device", args.device, "--dtype", args.dtype]
        same += ["--seconds", str(args.seconds), "--batch", *map(str, args.batch)]
        child = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "bare", *same],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        bare_rows = [json.loads(line) for line in child.stdout.splitlines() if line.strip()]
        for row in bare_rows:
            print(json.dumps(row), flush=True)
    log("served ...")
    served_rows = served(args)
    if bare_rows:
        print("\nBare model\n" + table(bare_rows, list(bare_rows[0])))
    keys = ["mode", "workers", "concurrency", "req_per_s", "p50_ms", "p99_ms", "mean_batch"]
    keys.append("gpu_busy_pct")
    print("\nServed\n" + table(served_rows, keys))


if __name__ == "__main__":
    main()
