"""Where a handler's model runs: ``SERVING_DEVICE`` resolved to a torch device, after fork.

serving-core hands the handler the *requested* device (``self.device``) and
precision (``self.dtype``) before ``setup()``. The weights load on the CPU in
``setup()``, in the master, and move in ``setup_worker()``: initialising CUDA
before fork leaves every forked worker with a CUDA context it cannot use
("Cannot re-initialize CUDA in forked subprocess"). So ``resolve`` asks torch
about GPUs, and must be called only after fork, in ``setup_worker()`` (or
anywhere in a process that never forks, such as ``serving-core check``).

A requested GPU that is not there falls back to the CPU with a warning rather
than failing start-up: the same image and settings then run on a laptop, in
CI and on a GPU node. Imports torch only when called.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("serving_core.device")

PROC_GPUS = "/proc/driver/nvidia/gpus"  # one folder per GPU the driver knows


def visible_gpus(environ: Mapping[str, str] | None = None, proc: str = PROC_GPUS) -> int:
    """How many NVIDIA GPUs this process may use, without touching CUDA (safe before
    fork): CUDA_VISIBLE_DEVICES when set, else the driver's entries in /proc."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(os.listdir(proc))
    except OSError:
        return 0


def model_devices(
    device: str, processes: int, environ: Mapping[str, str] | None = None
) -> list[str]:
    """The device of each shared model process: with SERVING_DEVICE=cuda, one per
    visible GPU (or ``processes`` of them, round robin); otherwise ``processes``
    (at least one) on the requested device."""
    if device == "cuda":
        gpus = visible_gpus(environ)
        if gpus:
            return [f"cuda:{i % gpus}" for i in range(processes or gpus)]
    return [device] * max(1, processes)


def resolve(requested: str) -> str:
    """The torch device to use for ``requested`` (cpu, auto, cuda, cuda:N)."""
    if requested == "cpu":
        return "cpu"
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "cuda" if count else "cpu"
    index = int(requested.partition(":")[2] or 0)
    if index >= count:
        seen = f"{count} GPU(s) visible" if count else "no GPU visible (or a CPU build of torch)"
        log.warning(
            "SERVING_DEVICE=%s, but %s: running on the CPU; check the GPU limit, the "
            "runtime class and CUDA_VISIBLE_DEVICES, or set SERVING_DEVICE=cpu",
            requested,
            seen,
        )
        return "cpu"
    return requested


def torch_dtype(name: str, device: str) -> Any:
    """The torch dtype for ``SERVING_DTYPE`` on ``device``.

    Half precision is for GPUs: on a CPU float16 matmuls are slower than float32
    (and some kernels are missing), so a CPU device keeps float32 and says so.
    """
    import torch

    if device == "cpu" and name != "float32":
        log.warning("SERVING_DTYPE=%s ignored on the CPU: running in float32", name)
        return torch.float32
    return getattr(torch, name)
