"""The running sequences' KV caches, held as one left-padded batch for one forward per step.

Each sequence is prefilled alone (its cache has no padding), then joins the
batch: the shorter side is padded on the left with zeros, which the attention
mask hides, so every row ends at the same column and the next token of every
row is written at the end. A sequence that leaves is dropped from the batch,
and so are the columns that only its padding needed. Membership changes once
per join or leave; a step in between is one forward and no copy of the caches
beyond the one the model's cache makes to append.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.functional import pad
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class Row:
    """What the batch needs of one sequence: the token to feed next and its position."""

    token: int = 0
    position: int = 0  # tokens before ``token``: the position id it is fed at


class Rows:
    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.clear()

    def clear(self) -> None:
        self.members: list[Row] = []
        self.cache = DynamicCache()
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)

    def keep(self, members: Sequence[Row]) -> None:
        """Hold exactly ``members`` (already in the batch), in this order."""
        if list(members) == self.members:
            return
        if not members:
            self.clear()
            return
        row = {id(member): i for i, member in enumerate(self.members)}
        index = torch.tensor([row[id(m)] for m in members], device=self.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        # The columns that only the left padding of rows now gone needed.
        unused = int(self.mask.any(dim=0).long().argmax())
        if unused:
            for layer in _layers(self.cache):
                keys, values = _tensors(layer)
                layer.keys, layer.values = keys[..., unused:, :], values[..., unused:, :]
            self.mask = self.mask[:, unused:]
        self.members = list(members)

    def add(self, member: Row, cache: DynamicCache) -> None:
        """A prefilled sequence (``cache`` is its own, batch of one) joins the batch."""
        length = cache.get_seq_length()
        ones = torch.ones((1, length), dtype=torch.long, device=self.device)
        if not self.members:
            self.cache, self.mask, self.members = cache, ones, [member]
            return
        width = max(length, self.mask.shape[1])
        for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
            (keys, values), (new_keys, new_values) = _tensors(mine), _tensors(theirs)
            mine.keys = torch.cat([_left(keys, width), _left(new_keys, width)])
            mine.values = torch.cat([_left(values, width), _left(new_values, width)])
        self.mask = torch.cat([_left(self.mask, width, dim=1), _left(ones, width, dim=1)])
        self.members.append(member)

    def decode(self, model: Any) -> torch.Tensor:
        """One forward of every member's next token: the logits, a row per member."""
        tokens = torch.tensor([[m.token] for m in self.members], device=self.device)
        positions = torch.tensor([[m.position] for m in self.members], device=self.device)
        self.mask = pad(self.mask, (0, 1), value=1)
        out = model(
            input_ids=tokens,
            past_key_values=self.cache,
            attention_mask=self.mask,
            position_ids=positions,
            use_cache=True,
        )
        for member in self.members:
            member.position += 1
        logits: torch.Tensor = out.logits[:, -1, :]
        return logits


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    """A GPT-2's cache layers: all of them ``DynamicLayer``s, keys and values in tensors."""
    return [layer for layer in cache.layers if isinstance(layer, DynamicLayer)]


def _tensors(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """A filled layer's keys and values."""
    if layer.keys is None or layer.values is None:
        raise ValueError("a cache layer without keys: prefill a sequence before it joins")
    return layer.keys, layer.values


def _left(tensor: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    """``tensor`` padded with zeros on the left of ``dim`` to ``width``."""
    missing = width - tensor.shape[dim]
    if not missing:
        return tensor
    # F.pad lists (left, right) pairs from the last dimension backwards.
    pairs = [0, 0] * (tensor.dim() - 1 - (dim % tensor.dim())) + [missing, 0]
    return pad(tensor, pairs)
