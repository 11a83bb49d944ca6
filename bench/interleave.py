"""A worker's run with the bare-model limit measured during it, and where the CPU went.

Used by ``jobs.py`` and ``stream.py``: this VM's speed drifts by 10-20% within a
minute, so a limit measured only before and after a run misses what the run
saw. ``run_interleaved`` lets the worker run until ``done``, and every
``slice_s`` of its run (and before and after it) stops its process group with
SIGSTOP while ``measure`` runs the bare cell alone, then continues it. Only the
worker's running time counts, and only its CPU over those spans.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
POLL_S = 0.05


def busy_s() -> float:
    """CPU seconds the whole machine spent busy (every core), from /proc/stat."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(
            int, stat.readline().split()[1:9]
        )
    return (user + nice + system + irq + softirq + steal) * TICK_S


def session_cpu_s(session: int) -> float:
    """CPU seconds of the live processes of one session (the worker's master and consumers)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session:
                total += int(fields[11]) + int(fields[12])
    return total * TICK_S


def own_cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def cpu_seconds(session: int) -> tuple[float, float, float]:
    """The whole machine's busy CPU seconds, the worker's (its session), this script's."""
    return busy_s(), session_cpu_s(session), own_cpu_s()


def measure_stopped(group: int, measure: Callable[[], float]) -> float:
    """``measure`` while the worker's process group is stopped (it started a session of
    its own, so its pid is the group's); its consumers hold their place meanwhile."""
    os.killpg(group, signal.SIGSTOP)
    try:
        return measure()
    finally:
        os.killpg(group, signal.SIGCONT)


@dataclass
class Interleaved:
    """What ``run_interleaved`` saw."""

    # Wall-clock (time.time()) spans in which the worker ran, the last ending when
    # ``done`` first held.
    windows: list[tuple[float, float]] = field(default_factory=list)
    # CPU seconds over the windows: the machine's, the worker's, this script's.
    cpu: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    limits: list[float] = field(default_factory=list)  # every measurement of the cell

    @property
    def ran_s(self) -> float:
        return sum(end - start for start, end in self.windows)


def run_interleaved(
    session: int,
    measure: Callable[[], float],
    done: Callable[[], bool],
    slice_s: float,
    start: Callable[[], object] = lambda: None,
) -> Interleaved:
    """Measure once, call ``start`` (hand the worker its work), let it run until
    ``done``, stopping it to measure every ``slice_s``; measure once more."""
    seen = Interleaved(limits=[measure_stopped(session, measure)])

    def close_window(started: float, cpu_at: tuple[float, float, float]) -> None:
        for i, (now, then) in enumerate(zip(cpu_seconds(session), cpu_at, strict=True)):
            seen.cpu[i] += now - then
        seen.windows.append((started, time.time()))

    started, cpu_at = time.time(), cpu_seconds(session)
    start()
    while not done():
        time.sleep(POLL_S)
        if time.time() - started >= slice_s and not done():
            close_window(started, cpu_at)
            seen.limits.append(measure_stopped(session, measure))
            started, cpu_at = time.time(), cpu_seconds(session)
    close_window(started, cpu_at)
    seen.limits.append(measure_stopped(session, measure))
    return seen
