"""How many cores this process may really use.

``os.cpu_count()`` reports the host's cores; in a container the CPU quota
(cgroup v2 ``cpu.max``, or v1 ``cfs_quota_us``) and the affinity mask are what
bound us. Oversubscribing torch threads beyond that collapses throughput, so
the worker and thread defaults are derived from this number.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores(cgroup_root: Path = CGROUP_ROOT) -> int:
    """The smaller of the affinity mask and the cgroup CPU quota, at least 1."""
    # The affinity mask is Linux's: macOS has none, and no cgroups either.
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    quota = cgroup_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota)))
    return max(1, cores)


def cgroup_quota(cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """CPUs granted by the cgroup quota, or None when unlimited or unknown."""
    v2 = cgroup_root / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().strip().partition(" ")
        if quota == "max" or not period:
            return None
        return int(quota) / int(period)
    v1 = cgroup_root / "cpu" / "cpu.cfs_quota_us"
    if v1.is_file():
        quota_us = int(v1.read_text().strip())
        period_us = int((cgroup_root / "cpu" / "cpu.cfs_period_us").read_text().strip())
        return None if quota_us <= 0 else quota_us / period_us
    return None
