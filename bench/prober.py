"""The kubelet's prober, played from here for ``probes.py``: a rendered probe run every
periodSeconds, failed on an error or after timeoutSeconds. An exec probe goes through
the engine's exec, so its process is charged to the container's cgroup and throttled
with it; an httpGet is a GET on the published port."""

from __future__ import annotations

import http.client
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.overload import percentile
from tests.container.engine import Engine


@dataclass
class Probe:
    """One of the rendered probes, run as the kubelet's prober does."""

    name: str
    spec: dict[str, Any]
    ports: dict[int, int] = field(default_factory=dict)  # an httpGet's: container -> host
    timed_inside: bool = False
    offset_s: float = 0.0  # the first run's delay
    runs: list[tuple[float, float, bool, str]] = field(default_factory=list)  # at, took, ok, why
    inside_ms: list[float] = field(default_factory=list)

    def argv(self) -> list[str]:
        command: list[str] = self.spec["exec"]["command"]
        if not self.timed_inside:
            return command
        # The same command, timed by the container's own clock: what the engine's
        # exec adds (runc exec, the CLI) is the rest of the latency.
        script = (
            'a=$(date +%s%N); "$@"; s=$?; b=$(date +%s%N); echo "inside_ns=$((b - a))"; exit $s'
        )
        return ["sh", "-c", script, "sh", *command]

    def once(self, engine: Engine, container: str) -> tuple[float, bool, str]:
        timeout_s = float(self.spec.get("timeoutSeconds", 1))
        started = time.monotonic()
        if "httpGet" in self.spec:
            return self.get(timeout_s, started)
        try:
            done = engine.exec(container, self.argv(), timeout_s=timeout_s)
        except subprocess.TimeoutExpired:
            return time.monotonic() - started, False, f"no answer within {timeout_s:g} s"
        took = time.monotonic() - started
        inside = re.search(r"inside_ns=(\d+)", done.stdout)
        if inside:
            self.inside_ms.append(int(inside.group(1)) / 1e6)
        return took, done.returncode == 0, (done.stderr or done.stdout).strip()[-300:]

    def get(self, timeout_s: float, started: float) -> tuple[float, bool, str]:
        """The kubelet's httpGet: a new connection, a 2xx or 3xx within the timeout."""
        action = self.spec["httpGet"]
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[action["port"]], timeout_s)
        try:
            conn.request("GET", action["path"])
            response = conn.getresponse()
            response.read()
        except OSError as exc:
            return time.monotonic() - started, False, str(exc)
        finally:
            conn.close()
        took = time.monotonic() - started
        return took, 200 <= response.status < 400, f"{action['path']}: {response.status}"

    def loop(self, engine: Engine, container: str, start: float, stop: threading.Event) -> None:
        period = float(self.spec.get("periodSeconds", 10))
        tick = time.monotonic() + self.offset_s
        stop.wait(self.offset_s)
        while not stop.is_set():
            took, ok, why = self.once(engine, container)
            self.runs.append((tick - start, took, ok, why))
            tick += period
            while tick < time.monotonic():  # a run longer than the period skips ticks
                tick += period
            stop.wait(tick - time.monotonic())

    def summary(self) -> dict[str, Any]:
        streak = longest = 0
        for _, _, ok, _ in self.runs:
            streak = 0 if ok else streak + 1
            longest = max(longest, streak)
        threshold = int(self.spec.get("failureThreshold", 3))
        took_ms = sorted(took * 1000 for _, took, _, _ in self.runs)
        spread = _spread(took_ms)
        failures = [(round(at, 1), why) for at, _, ok, why in self.runs if not ok]
        return {
            "probe": self.name,
            "runs": len(self.runs),
            "failed": len(failures),
            "longest_failure_streak": longest,
            "failure_threshold": threshold,
            "held": longest < threshold,
            "timeout_ms": float(self.spec.get("timeoutSeconds", 1)) * 1000,
            **spread,
            "failures": failures[:20],
            **(
                {f"inside_{k}": v for k, v in _spread(sorted(self.inside_ms)).items()}
                if self.timed_inside
                else {}
            ),
        }


def _spread(ms: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": ms[-1] if ms else float("nan"),
    }


def started_up(engine: Engine, container: str, spec: dict[str, Any]) -> tuple[int, float]:
    """The startup probe run every periodSeconds until it passes: (runs, seconds)."""
    probe, started = Probe("startup", spec), time.monotonic()
    for run in range(1, int(spec.get("failureThreshold", 3)) + 1):
        took, ok, why = probe.once(engine, container)
        if ok:
            return run, time.monotonic() - started
        if not engine.running(container):
            raise SystemExit(f"the app exited:\n{engine.logs(container)[-4000:]}")
        time.sleep(max(0.0, float(spec.get("periodSeconds", 10)) - took))
    raise SystemExit(f"the startup probe never passed ({why}):\n{engine.logs(container)[-4000:]}")
