"""The request path's own CPU: serving-core's echo against a bare Flask app, same worker.

Starts, in one run, two gunicorn servers with one worker each, of the same
worker class (serving-core's gevent worker by default):

- ``hello``: a bare Flask app whose one view, ``POST /predict``, returns the
  JSON body it was sent as ``{"echo": ...}`` (what the echo handler answers);
- ``echo``: ``serving-core serve`` with ``handlers/echo`` and the default
  settings (cache, metrics, access line, request ids, validation, batcher).

Each round drives each server with the same fixed number of requests from
``wrk`` (keep-alive, ``bench/cpu_path.lua``: every body unique, so the echo's
inference cache never hits), reads the worker process's CPU (utime + stime
of every thread, ``/proc/PID/stat``) before and after, and prints the CPU per
request and the ratio echo / hello of that round. Other sessions share the two
cores, so it runs in rounds (alternating which server goes first) and prints
the median and range. ``--profile DIR`` then samples each worker with py-spy
under the same load and prints the top entries (self and inclusive).

    .venv/bin/python bench/cpu_path.py [--rounds 5] [--requests 20000] [--connections 32]
        [--worker-class gevent] [--env SERVING_X=Y ...] [--traces] [--profile /tmp/cpu-path]

``--traces`` turns the echo's traces on, every request sampled (unless ``--env``
names another ``OTEL_TRACES_SAMPLER``), exported to an OTLP receiver in this
process: the rise in µs per request is what tracing costs the request path.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flask import Flask, request  # noqa: E402

from bench.interleave import busy_s  # noqa: E402
from serving_core.process.options import WORKER_CLASSES  # noqa: E402
from tests.otlp_receiver import receiving  # noqa: E402
from tests.servers import base_env, free_port, gunicorn_server, stop  # noqa: E402

LUA_ARGS = ["-s", str(ROOT / "bench" / "cpu_path.lua")]
GUNICORN = Path(sys.executable).parent / "gunicorn"
PY_SPY = Path(sys.executable).parent / "py-spy"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
WARM_UP_REQUESTS = 2000


def hello_app() -> Flask:
    """The bare Flask app (gunicorn loads it as ``bench.cpu_path:hello_app()``)."""
    app = Flask("hello")

    @app.post("/predict")
    def predict() -> dict[str, Any]:
        return {"echo": request.get_json()}

    return app


def cpu_s(pid: int, tid: int | None = None) -> float:
    """CPU seconds so far (utime + stime) of every thread of ``pid``, or of thread ``tid``."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def switches(pid: int) -> int:
    """Context switches (voluntary and not) of every thread of ``pid`` so far."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(OSError):
            for line in status.read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
    return total


def system_s(pid: int) -> float:
    """Kernel CPU seconds (stime) of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[12]) * TICK_S


def only_worker(master: int, timeout_s: float = 30.0) -> int:
    """The pid of the one worker of gunicorn master ``master``."""
    path = Path(f"/proc/{master}/task/{master}/children")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = path.read_text().split()
        if len(children) == 1:
            return int(children[0])
        time.sleep(0.1)
    raise RuntimeError(f"gunicorn {master} has workers {children}, not one")


@contextlib.contextmanager
def hello_server(worker_class: str, threads: int) -> Iterator[tuple[str, int]]:
    """gunicorn with one worker of ``worker_class`` over ``hello_app``: (url, master pid)."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="cpu-path-") as tmp:
        log_path = Path(tmp) / "hello.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    str(GUNICORN),
                    "--workers=1",
                    f"--worker-class={WORKER_CLASSES[worker_class]}",
                    f"--threads={threads}",
                    f"--bind=127.0.0.1:{port}",
                    "--no-control-socket",
                    "bench.cpu_path:hello_app()",
                ],
                cwd=ROOT,
                env=base_env({}),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_answers(url, process, log_path)
            yield url, process.pid
        finally:
            stop(process)


def _wait_answers(url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
    import requests

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the hello server exited:\n{log_path.read_text()}")
        with contextlib.suppress(requests.RequestException):
            if requests.post(url + "/predict", json={"text": "hi"}, timeout=1).ok:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the hello server never answered:\n{log_path.read_text()}")


def wrk(url: str, requests: int, connections: int, threads: int) -> dict[str, Any]:
    """``requests`` POSTs (or a few more: each thread stops at its share) over keep-alive."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install wrk")
    env = dict(os.environ, WRK_REQUESTS=str(-(-requests // threads)))
    process = subprocess.Popen(
        ["wrk", f"-t{threads}", f"-c{connections}", "-d600s", "--timeout", "30s", *LUA_ARGS, url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        done = 0
        for line in process.stderr:
            done += line.startswith("WRK_DONE")
            if done == threads:
                break
        # wrk waits out its -d even when every thread stopped; SIGINT ends it with its summary.
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    match = re.search(r"^WRK_JSON (.*)$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}{err}")
    result: dict[str, Any] = json.loads(match.group(1))
    bad = {status: n for status, n in result["statuses"].items() if status != "200"}
    if bad or result["socket_errors"]:
        raise RuntimeError(f"not every request answered 200: {result}")
    return result


def measure(url: str, worker: int, args: argparse.Namespace) -> dict[str, Any]:
    wrk(url, WARM_UP_REQUESTS, args.connections, args.wrk_threads)
    # The main thread is the gevent hub (gthread: the poller); the rest are the
    # request threads (gthread), the model thread and the watchdog.
    hub_at, cpu_at, busy_at = cpu_s(worker, worker), cpu_s(worker), busy_s()
    system_at, switches_at, wall_at = system_s(worker), switches(worker), time.monotonic()
    result = wrk(url, args.requests, args.connections, args.wrk_threads)
    cpu, busy, wall = cpu_s(worker) - cpu_at, busy_s() - busy_at, time.monotonic() - wall_at
    hub, system = cpu_s(worker, worker) - hub_at, system_s(worker) - system_at
    requests = result["requests"]
    return {
        "requests": requests,
        "us_per_request": cpu / requests * 1e6,
        "main_us_per_request": hub / requests * 1e6,
        "system_us_per_request": system / requests * 1e6,
        "switches_per_request": (switches(worker) - switches_at) / requests,
        "per_s": result["requests"] / result["duration_s"],
        "p50_ms": result["p50_ms"],
        # Cores' worth of CPU the worker did not use: wrk, and anything else running.
        "other_cores": (busy - cpu) / wall,
    }


def profile(url: str, worker: int, args: argparse.Namespace, out: Path) -> Path:
    """py-spy's collapsed stacks of ``worker`` over one fixed load: 250 samples/s, busy
    threads only (py-spy leaves out a thread waiting in the kernel). It stops the
    worker for each sample, so this run's CPU and rates are not comparable."""
    if not PY_SPY.exists():
        raise SystemExit("py-spy is missing: .venv/bin/pip install py-spy")
    wrk(url, WARM_UP_REQUESTS, args.connections, args.wrk_threads)
    spy = subprocess.Popen(
        [
            *(str(PY_SPY), "record", "--pid", str(worker), "--rate", "250", "--format", "raw"),
            *("--output", str(out), "--threads"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # py-spy attaches
    wrk(url, args.requests, args.connections, args.wrk_threads)
    spy.send_signal(signal.SIGINT)  # py-spy writes its file and exits
    _, err = spy.communicate(timeout=60)
    if not out.exists():
        raise RuntimeError(f"py-spy wrote nothing: {err.decode(errors='replace')}")
    return out


Shares = list[tuple[str, float]]


def top_entries(collapsed: Path, count: int) -> tuple[Shares, Shares]:
    """Shares of the main thread's busy samples (the gevent hub, where the worker's CPU
    goes), by function's own time (self) and by function with what it calls."""
    own: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    total = 0
    # One "thread (TID): NAME;frame;frame;... count" per line.
    for stack, n in re.findall(r"^thread \(\d+\): (.*?) (\d+)$", collapsed.read_text(), re.M):
        thread, *frames = stack.split(";")
        if thread != "MainThread" or not frames:
            continue
        total += int(n)
        own[_short(frames[-1])] += int(n)
        for name in {_short(frame) for frame in frames}:
            within[name] += int(n)
    return (
        [(name, n / total) for name, n in own.most_common(count)],
        [(name, n / total) for name, n in within.most_common(count)],
    )


def _short(frame: str) -> str:
    # "post (serving_core/web/routes.py:30)" -> "post (serving_core/web/routes.py)": lines split a
    # function's samples; the site-packages prefix only adds width.
    frame = re.sub(r":\d+\)$", ")", frame)
    return re.sub(r"\(.*?/(site-packages|lib/python3\.\d+)/", "(", frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20000, help="per server per round")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--worker-class", choices=sorted(WORKER_CLASSES), default="gevent")
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y for the echo")
    parser.add_argument(
        "--traces",
        action="store_true",
        help="the echo traces every request (SERVING_TRACES=otlp, always sampled) to an "
        "OTLP receiver in this process",
    )
    parser.add_argument("--profile", type=Path, help="then py-spy each worker; stacks go here")
    parser.add_argument("--top", type=int, default=25, help="profile entries to print")
    args = parser.parse_args()
    # A SIGTERM (timeout, kill) still runs the finally blocks that stop the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    env = {
        "SERVING_HANDLER": str(ROOT / "handlers/echo"),
        "SERVING_WORKERS": "1",
        "SERVING_WORKER_CLASS": args.worker_class,
        **dict(item.split("=", 1) for item in args.env),
    }
    threads = 4 * 16  # serving-core's default gthread threads (4 batches of 16)
    rows: list[dict[str, Any]] = []
    stacks: dict[str, Path] = {}
    with contextlib.ExitStack() as stack:
        if args.traces:
            # The SDK's own batching (OTEL_BSP_* defaults) to a receiver that only
            # decodes: the worker's CPU holds the spans, their export and its thread.
            receiver = stack.enter_context(receiving())
            env.update(SERVING_TRACES="otlp", OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
            env.setdefault("OTEL_TRACES_SAMPLER", "always_on")  # --env may name another
        hello_url, hello_master = stack.enter_context(hello_server(args.worker_class, threads))
        echo = stack.enter_context(gunicorn_server(env))
        servers = {
            "hello": (hello_url, only_worker(hello_master)),
            "echo": (echo.url, only_worker(echo.pid)),
        }
        print(
            f"{args.worker_class} worker, 1 each; wrk -t{args.wrk_threads} "
            f"-c{args.connections}, {args.requests} requests per server per round"
        )
        print(
            f"{'round':>5} {'server':>6} {'us/req':>7} {'main thread':>11} {'kernel':>6} "
            f"{'switches':>8} {'req/s':>8} {'p50 ms':>7} {'other cores':>11}"
        )
        for round_ in range(1, args.rounds + 1):
            order = ["hello", "echo"] if round_ % 2 else ["echo", "hello"]
            for name in order:
                url, worker = servers[name]
                row = measure(url, worker, args)
                row.update(round=round_, server=name)
                rows.append(row)
                print(
                    f"{round_:>5} {name:>6} {row['us_per_request']:>7.1f} "
                    f"{row['main_us_per_request']:>11.1f} {row['system_us_per_request']:>6.1f} "
                    f"{row['switches_per_request']:>8.2f} {row['per_s']:>8.0f} "
                    f"{row['p50_ms']:>7.2f} "
                    f"{row['other_cores']:>11.2f}",
                    flush=True,
                )
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            stacks = {
                name: profile(url, worker, args, args.profile / f"{name}.txt")
                for name, (url, worker) in servers.items()
            }
    summarise(rows)
    if args.profile:
        for name, path in stacks.items():
            own, within = top_entries(path, args.top)
            print(f"\n{name}: py-spy, shares of the main thread's busy samples ({path})")
            print(f"{'self':>6}  function")
            print("\n".join(f"{share:>6.1%}  {fn}" for fn, share in own))
            print(f"{'total':>6}  function, with what it calls")
            print("\n".join(f"{share:>6.1%}  {fn}" for fn, share in within))


def summarise(rows: list[dict[str, Any]]) -> None:
    per = {
        name: [r["us_per_request"] for r in rows if r["server"] == name]
        for name in ("hello", "echo")
    }
    ratios = [e / h for e, h in zip(per["echo"], per["hello"], strict=True)]
    print(f"\nworker CPU per request, median (range) over {len(ratios)} rounds")
    for name, values in per.items():
        print(
            f"{name:>6}: {statistics.median(values):6.1f} us ({min(values):.1f}-{max(values):.1f})"
        )
    print(
        f" ratio: {statistics.median(ratios):6.2f}    ({min(ratios):.2f}-{max(ratios):.2f}) "
        "echo / hello, each round's pair; goal <= 1.5"
    )


if __name__ == "__main__":
    main()
