"""Train the example text generator: a small GPT-2 on genesis.txt, saved to a folder.

    python handlers/textgen/train.py [DIR]

DIR defaults to $TEXTGEN_MODEL_DIR, else handlers/textgen/model. The folder gets
the model (``save_pretrained``: config.json, model.safetensors) and its
byte-level BPE tokenizer (tokenizer.json), both made here from the text beside
this file: nothing is downloaded. Seeded, with a fixed number of steps, so the
same machine trains the same model; about a minute on two CPU cores. The
folder appears whole or not at all (written beside it, then renamed), so a
server or a test that finds it can load it.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "genesis.txt"
#: The variable naming the model folder: the handler and this script read it.
MODEL_DIR_VARIABLE = "TEXTGEN_MODEL_DIR"
EOS = "<|endoftext|>"

VOCAB = 2048  # whole words for most of the text's ~4,400 distinct ones
CONTEXT = 512  # positions the model has: a prompt and its tokens together
BLOCK = 256  # tokens per training row
BATCH = 8
STEPS = 300
PEAK_LR = 3e-3
WARMUP = 30
SEED = 0


def model_dir() -> Path:
    """Where the model lives: $TEXTGEN_MODEL_DIR, else the folder beside this file."""
    return Path(os.environ.get(MODEL_DIR_VARIABLE) or HERE / "model")


def documents() -> list[str]:
    """The chapters (blank-line separated), each a training document."""
    return [part.strip() + "\n" for part in CORPUS.read_text().split("\n\n") if part.strip()]


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def token_id(tokenizer: Tokenizer, token: str) -> int:
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ValueError(f"{token!r} is not in this tokenizer; train it with train.py")
    return found


def token_stream(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """Every chapter's tokens, each after an end-of-text token (how the handler
    starts every prompt), in one long row."""
    eos = token_id(tokenizer, EOS)
    ids: list[int] = []
    for text in texts:
        ids.append(eos)
        ids.extend(tokenizer.encode(text).ids)
    return torch.tensor(ids, dtype=torch.long)


def train(out: Path) -> None:
    torch.manual_seed(SEED)
    texts = documents()
    tokenizer = train_tokenizer(texts)
    stream = token_stream(tokenizer, texts)
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=CONTEXT,
        n_embd=128,
        n_layer=4,
        n_head=4,
        bos_token_id=token_id(tokenizer, EOS),
        eos_token_id=token_id(tokenizer, EOS),
    )
    model = GPT2LMHeadModel(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, weight_decay=0.01)
    generator = torch.Generator().manual_seed(SEED)
    started = time.monotonic()
    for step in range(STEPS):
        # Linear warm-up, then cosine decay to a tenth.
        progress = max(0.0, (step - WARMUP) / (STEPS - WARMUP))
        scale = min(1.0, (step + 1) / WARMUP) * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = PEAK_LR * scale
        starts = torch.randint(0, len(stream) - BLOCK, (BATCH,), generator=generator)
        rows = torch.stack([stream[s : s + BLOCK] for s in starts.tolist()])
        loss = model(input_ids=rows, labels=rows).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == STEPS - 1:
            elapsed = time.monotonic() - started
            print(f"step {step}: loss {loss.item():.3f} ({elapsed:.0f} s)", flush=True)
    save(model.train(False), tokenizer, out)


def save(model: GPT2LMHeadModel, tokenizer: Tokenizer, out: Path) -> None:
    """Into a new folder beside ``out``, then renamed to it: never half written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(partial)
        tokenizer.save(str(partial / "tokenizer.json"))
        os.rename(partial, out)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (out / "tokenizer.json").exists():
            raise  # not another run's model arriving first


if __name__ == "__main__":
    train(Path(sys.argv[1]) if len(sys.argv) > 1 else model_dir())
