"""The bare-model limit, onnxruntime against torch: MiniLM sentences/s, no server.

Loads handlers/minilm (torch, traced) and handlers/minilm-onnx (the ONNX
export, onnxruntime) in one process with the same intra-op threads, and runs
each handler's ``predict_batch`` (tokenise, forward, pool, normalise) on the
same batches, the two runtimes alternating cell by cell so that this VM's drift
falls on both alike. Prints sentences/s per batch size and onnx/torch.

    .venv/bin/python bench/onnx_vs_torch.py [--seconds 2] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.workload import SENTENCES  # noqa: E402
from serving_core.cores import usable_cores  # noqa: E402

BATCH_SIZES = [1, 8, 32]


def rate(handler: Any, size: int, seconds: float) -> float:
    """Sentences/s of ``handler.predict_batch`` on batches of ``size`` for ``seconds``."""
    batches = [
        [{"text": SENTENCES[(i + j) % len(SENTENCES)]} for j in range(size)]
        for i in range(0, len(SENTENCES), size)
    ]
    handler.predict_batch(batches[0])  # warm-up
    done, i = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        handler.predict_batch(batches[i % len(batches)])
        done += size
        i += 1
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per cell")
    parser.add_argument("--threads", type=int, default=usable_cores(), help="intra-op threads")
    args = parser.parse_args()

    import torch

    from serving_core.loading import load_handler

    # serving-core sets torch's threads before setup_worker(); the ONNX handler's
    # session takes the same number there.
    torch.set_num_threads(args.threads)
    handlers = {}
    for label, name in (("torch", "minilm"), ("onnx", "minilm-onnx")):
        handler = load_handler(str(ROOT / "handlers" / name)).handler
        handler.setup()
        handler.setup_worker()
        handlers[label] = handler

    print(f"bare model, {args.threads} intra-op thread(s), {args.seconds:.0f} s per cell")
    print(f"{'batch':>5}  {'torch':>10}  {'onnx':>10}  {'onnx/torch':>10}")
    for size in BATCH_SIZES:
        rates = {label: rate(handler, size, args.seconds) for label, handler in handlers.items()}
        print(
            f"{size:>5}  {rates['torch']:>8.1f}/s  {rates['onnx']:>8.1f}/s"
            f"  {rates['onnx'] / rates['torch']:>10.2f}"
        )


if __name__ == "__main__":
    main()
