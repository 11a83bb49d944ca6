"""Torch's intra-op threads around fork, for every command that preloads a model.

One multi-threaded torch operation before fork leaves GNU OpenMP's thread
pool unusable in the forked children: a child then hangs on its first
parallel operation on its main thread. So the master keeps torch at one
thread (no pool exists at fork), and each child takes its share of the
usable cores after fork. ``serve``, ``batch`` and ``worker`` all do this.
Touches torch only when the handler imported it.
"""

from __future__ import annotations

import sys

from serving_core.cores import usable_cores


def limit_master_threads() -> None:
    """Keep torch (if the handler uses it) single-threaded in the master, before fork."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def set_worker_threads(workers: int) -> int | None:
    """Give each forked process its share of the usable cores for torch's intra-op pool;
    the share, or None where the handler does not use torch."""
    return set_model_threads(max(1, usable_cores() // workers))


def set_model_threads(threads: int) -> int | None:
    """Set torch's intra-op threads in this (forked) process, if the handler uses torch;
    ``threads``, or None where it does not (nothing was set)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    torch.set_num_threads(threads)
    return threads
