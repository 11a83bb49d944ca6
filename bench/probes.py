"""Do the chart's app probes hold when the app container is at its CPU limit?

Runs the MiniLM app image as the chart runs its app container: the chart's
defaults rendered by Helm (environment, command, user, read-only root, dropped
capabilities, memory limit, the unix socket), with ``--cpus`` as its CPU limit,
and the chart's nginx container beside it when a probe reaches the app through
nginx (an httpGet). Drives ``--concurrency`` closed-loop keep-alive connections
of MiniLM requests at the app's socket (not through nginx) for ``--seconds``,
and meanwhile runs the rendered readiness and liveness probes as the kubelet
does: every periodSeconds, failed on an error or after timeoutSeconds. An exec
probe runs through ``<engine> exec``, so, as under the kubelet, its process is
charged to the container's cgroup and throttled with it; an httpGet is a GET
from here (the kubelet's side) on the published port.

It prints, and writes to bench/figures/probes-<kind>-<cpus>.json: the
container's CFS periods and throttled periods over the run (its cgroup's
``cpu.stat``), its CPU use and the whole machine's, the requests answered by
status, and for each probe: runs, failures, the longest streak of consecutive
failures against failureThreshold, and latency p50/p99/max against
timeoutSeconds. A third series ("timed") runs the first exec probe's command
half a period after it, timed by the container's own clock: the rest of its
latency is the engine's exec (the CLI, runc), which differs between podman and
a kubelet's runtime. Before the load, each at idle, 5 runs.

    TORCH_INDEX_URL= .venv/bin/python bench/probes.py [--seconds 600] [--cpus 1]
        [--concurrency 64] [--image TAG] [--nginx-image TAG] [--env SERVING_X=Y ...]

The images are built first (tests/container: the Dockerfiles on their bases or
the stand-ins, each layer cached), unless ``--image`` / ``--nginx-image`` name
them; run as root with podman, as the container tests do.
SERVING_CACHE_SIZE=0 by default: the workload repeats its 64 sentences, which
the cache would answer without the model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.overload import percentile  # noqa: E402
from bench.pod import app_bind, build_image, cgroup_cpu_stat, rendered_pod, run_flags  # noqa: E402
from bench.prober import Probe, started_up  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from tests.container import bases  # noqa: E402
from tests.container.engine import Engine  # noqa: E402
from tests.container.images import app_build_args  # noqa: E402

TAG = "serving-core-bench:app-minilm"
NGINX_TAG = "serving-core-bench:nginx"
# The app image's build arguments, as image.yml passes them, for handlers/minilm.
MINILM = {**app_build_args(), "HANDLER_DIR": "handlers/minilm", "SHARED_DIRS": ""}
FIGURES = ROOT / "bench" / "figures"


def busy_s() -> float:
    """CPU seconds every core of the machine has been busy (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


async def _client(
    path: str, offset: int, stop_at: float, seen: Counter[str], took: list[float]
) -> None:
    bodies = [json.dumps({"text": s}).encode() for s in SENTENCES]
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    n = offset
    while time.monotonic() < stop_at:
        body, n = bodies[n % len(bodies)], n + 1
        started = time.monotonic()
        try:
            if writer is None:
                reader, writer = await asyncio.open_unix_connection(path)
            assert reader is not None
            writer.write(
                b"POST /predict HTTP/1.1\r\nHost: app\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            seen[type(exc).__name__] += 1
            if writer is not None:
                writer.close()
            writer = None
            await asyncio.sleep(0.05)  # the socket refused or closed: no busy loop
            continue
        status = head.split(b" ", 2)[1].decode()
        seen[status] += 1
        if status == "200":
            took.append(time.monotonic() - started)
        if re.search(rb"(?i)\r\nconnection: *close", head) or not length:
            writer.close()
            writer = None


def load(path: str, connections: int, seconds: float, out: Any) -> None:
    """Closed-loop keep-alive load on the unix socket ``path``; its figures go to ``out``."""
    seen: Counter[str] = Counter()
    took: list[float] = []
    stop_at = time.monotonic() + seconds

    async def run() -> None:
        await asyncio.gather(*(_client(path, i, stop_at, seen, took) for i in range(connections)))

    asyncio.run(run())
    ms = sorted(t * 1000 for t in took)
    p = {f"p{q}_ms": percentile(ms, q) for q in (50, 99)}
    answered = sum(n for status, n in seen.items() if status.isdigit())
    out.put({"statuses": dict(seen), "answered": answered, "ok_per_s": len(took) / seconds, **p})


def measure(
    engine: Engine,
    container: str,
    pod: dict[str, Any],
    args: argparse.Namespace,
    socket: str,
    *,
    ports: dict[int, int],
) -> dict[str, Any]:
    (app,) = [c for c in pod["containers"] if c["name"] == "app"]
    runs, startup_s = started_up(engine, container, app["startupProbe"])
    print(f"startup probe passed on run {runs}, {startup_s:.1f} s after start", flush=True)
    readiness, liveness = app["readinessProbe"], app["livenessProbe"]
    # The same command as the first exec probe, half a period after it, timed inside.
    timed = readiness if "exec" in readiness else liveness
    probes = [
        Probe("readiness", readiness, ports),
        Probe("liveness", liveness, ports),
        Probe("timed", timed, timed_inside=True, offset_s=timed["periodSeconds"] / 2),
    ]
    at_idle = Probe("timed", timed, timed_inside=True)
    idle = {
        "readiness_ms": [round(probes[0].once(engine, container)[0] * 1000, 1) for _ in range(5)],
        "timed_ms": [round(at_idle.once(engine, container)[0] * 1000, 1) for _ in range(5)],
        "timed_inside_ms": [round(ms, 1) for ms in at_idle.inside_ms],
    }
    print(
        f"idle: readiness {idle['readiness_ms']} ms; {' '.join(timed['exec']['command'])} "
        f"{idle['timed_ms']} ms, of which inside the container {idle['timed_inside_ms']} ms",
        flush=True,
    )
    pid = int(engine.inspect(container)["State"]["Pid"])
    out: Any = multiprocessing.Queue()
    loader = multiprocessing.Process(
        target=load, args=(socket, args.concurrency, args.seconds, out), daemon=True
    )
    cpu0, busy0, start = cgroup_cpu_stat(pid), busy_s(), time.monotonic()
    loader.start()
    stop = threading.Event()
    threads = [
        threading.Thread(target=p.loop, args=(engine, container, start, stop)) for p in probes
    ]
    for thread in threads:
        thread.start()
    while loader.is_alive():
        loader.join(60)
        now = cgroup_cpu_stat(pid)
        fails = {p.name: sum(not ok for *_, ok, _ in p.runs) for p in probes}
        throttled = now["nr_throttled"] - cpu0["nr_throttled"]
        print(
            f"{time.monotonic() - start:5.0f} s: throttled {throttled}"
            f" of {now['nr_periods'] - cpu0['nr_periods']} periods; probe failures {fails}; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    stop.set()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - start
    cpu1, busy1 = cgroup_cpu_stat(pid), busy_s()
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    return {
        "seconds": seconds,
        "cpus": args.cpus,
        "concurrency": args.concurrency,
        "env": args.env,
        "startup": {"runs": runs, "seconds": startup_s},
        "idle": idle,
        "cgroup": cpu,
        "container_cores": cpu["cpu_used_s"] / seconds,
        "machine_busy_cores": (busy1 - busy0) / seconds,
        "machine_cores": os.cpu_count(),
        "load": out.get(timeout=60),
        "probes": [p.summary() for p in probes],
    }


def report(result: dict[str, Any]) -> None:
    cg, load_ = result["cgroup"], result["load"]
    print(
        f"\n{result['seconds']:.0f} s at c={result['concurrency']}, CPU limit {result['cpus']}: "
        f"throttled in {cg['nr_throttled']} of {cg['nr_periods']} CFS periods "
        f"({cg['nr_throttled'] / max(1, cg['nr_periods']):.0%}, {cg['throttled_s']:.0f} s in all); "
        f"the container used {result['container_cores']:.2f} cores, the machine "
        f"{result['machine_busy_cores']:.2f} of {result['machine_cores']}"
    )
    print(
        f"requests answered: {load_['answered']}, by status {load_['statuses']}; 200s "
        f"{load_['ok_per_s']:.1f}/s, p50 {load_['p50_ms']:.0f} ms, p99 {load_['p99_ms']:.0f} ms"
    )
    print(
        f"{'probe':>10} {'runs':>5} {'failed':>6} {'streak':>6} {'threshold':>9} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'timeout':>7} {'held':>5}"
    )
    for p in result["probes"]:
        print(
            f"{p['probe']:>10} {p['runs']:>5} {p['failed']:>6} {p['longest_failure_streak']:>6} "
            f"{p['failure_threshold']:>9} {p['p50_ms']:>7.0f} {p['p99_ms']:>7.0f} "
            f"{p['max_ms']:>7.0f} {p['timeout_ms']:>7.0f} {p['held']!s:>5}"
        )
        if "inside_p50_ms" in p:
            print(
                f"{'':>10} timed inside the container: p50 {p['inside_p50_ms']:.0f} ms, "
                f"p99 {p['inside_p99_ms']:.0f} ms, max {p['inside_max_ms']:.0f} ms"
            )
        for at, why in p["failures"]:
            print(f"    failed at {at} s: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument(
        "--cpus", default="1", help="the CPU limit, as the chart takes it: 1, 1500m"
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--image", help="an app image of handlers/minilm; built if not given")
    parser.add_argument("--nginx-image", help="the nginx image, for probes through it")
    parser.add_argument("--env", nargs="*", default=["SERVING_CACHE_SIZE=0"])
    parser.add_argument(
        "--json", type=Path, help="default: bench/figures/probes-<readiness kind>-<cpus>.json"
    )
    args = parser.parse_args()
    engine = Engine.find()
    image = args.image or build_image(engine, ROOT, TAG, bases.PYTHON, MINILM)
    pod = rendered_pod(args.cpus)
    specs = {c["name"]: c for c in pod["containers"]}
    app = specs["app"]
    # An httpGet probe of the app reaches it through nginx (the pod's other
    # container, which holds every port): run it beside the app.
    through_nginx = any("httpGet" in app[p] for p in ("readinessProbe", "livenessProbe"))
    if through_nginx and not args.nginx_image:
        args.nginx_image = build_image(engine, ROOT / "nginx", NGINX_TAG, bases.NGINX, {})
    name = f"serving-core-bench-probes-{os.getpid()}"
    started: list[str] = []
    socket_dir = Path(tempfile.mkdtemp(prefix="serving-probes-"))
    try:
        user = pod["securityContext"]
        os.chown(socket_dir, user["runAsUser"], user["runAsGroup"])
        flags = run_flags(pod, app, socket_dir) + [f"--env={e}" for e in args.env]
        engine.call("run", "--detach", "--name", name, *flags, image, *app["command"])
        started.append(name)
        ports: dict[int, int] = {}
        if through_nginx:
            nginx = specs["nginx"]
            engine.call(
                "run", "--detach", "--name", f"{name}-nginx", *run_flags(pod, nginx, socket_dir),
                args.nginx_image,
            )  # fmt: skip
            started.append(f"{name}-nginx")
            for port in nginx["ports"]:
                number = port["containerPort"]
                ports[number] = engine.port(f"{name}-nginx", number)
        sock = str(socket_dir / Path(app_bind(app)).name)
        result = measure(engine, name, pod, args, sock, ports=ports)
    finally:
        for container in started:
            engine.call("rm", "--force", container, check=False, timeout_s=120)
        shutil.rmtree(socket_dir, ignore_errors=True)
    result["images"] = [image, args.nginx_image] if through_nginx else [image]
    report(result)
    kind = "http" if "httpGet" in app["readinessProbe"] else "exec"
    args.json = args.json or FIGURES / f"probes-{kind}-{args.cpus}.json"
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
