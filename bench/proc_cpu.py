"""CPU seconds of the processes a benchmark measures, from /proc.

- ``session_cpu_s``: every process of one session (a command started with
  ``start_new_session``: gunicorn's master and workers, the model process, a
  stream's or worker's consumers), each counted with every thread (utime +
  stime) and with its children that exited and were waited for (cutime +
  cstime), so a worker that exits and is replaced between two readings still
  counts. Take the difference of two readings.
- ``listener_cpu_s``: the process listening on a TCP port and its descendants
  (a broker: redis-server, RabbitMQ's Erlang VM and its helpers, Tansu), for
  the CPU that is the broker's and not the framework's.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str]:
    # The command name (field 2) may hold spaces and parentheses: split after its ")".
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def session_cpu_s(session: int) -> float:
    """CPU seconds so far of session ``session``'s live processes and their waited children."""
    return sum(session_ticks(session).values()) * TICK_S


def session_ticks(session: int) -> dict[int, int]:
    """Each live process of session ``session``: its CPU clock ticks and its waited children's."""
    ticks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = _stat(entry.name)
            # After the name: state, ppid, pgrp, session (3), ..., utime (11), stime,
            # cutime, cstime (14).
            if int(fields[3]) == session:
                ticks[int(entry.name)] = sum(int(f) for f in fields[11:15])
    return ticks


def listener_pid(port: int) -> int | None:
    """The pid listening on 127.0.0.1:``port`` (or any address), if this user may see it."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return conn.pid
    return None


def tree_cpu_s(pid: int) -> float:
    """CPU seconds so far of ``pid`` and its live descendants, with their waited children."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        total = 0.0
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
        return total
    return 0.0
