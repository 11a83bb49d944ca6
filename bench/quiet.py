"""Waiting for a quiet machine: other sessions run the test suite on these two cores at times."""

from __future__ import annotations

import subprocess
import time

POLL_S = 10.0


def wait_quiet(limit_s: float = 600.0) -> float:
    """Until no pytest runs (``pgrep -f bin/pytest``), polling every 10 s for at most
    ``limit_s``; returns the seconds waited (``limit_s`` or more: it never got quiet)."""
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        found = subprocess.run(["pgrep", "-f", "bin/pytest"], capture_output=True, check=False)
        if found.returncode != 0:
            break
        time.sleep(POLL_S)
    return time.monotonic() - started
