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
from typing import Any

log = logging.getLogger("serving_core.device")


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
