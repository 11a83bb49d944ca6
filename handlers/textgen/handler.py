"""A text generator with continuous batching: a small GPT-2 with a KV cache, in ``step``.

The model is trained here, on the public-domain text beside this file
(train.py; README.md says what it is), the first time ``setup()`` finds no
model in $TEXTGEN_MODEL_DIR (default: handlers/textgen/model). Input
``{"prompt": "...", "max_tokens": 32}``, optionally ``temperature`` (0, the
default, is greedy), ``top_p``, ``seed`` and ``stop`` (a string or up to four);
each chunk is ``{"text": "<new text>"}``.

Each step is one forward for every running sequence (``kvrows.Rows``): a
sequence's first step prefills its prompt alone and samples its first token,
every later one feeds its last token into the batched forward.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import DynamicCache, GPT2LMHeadModel

from serving_core import Final, Generation, Handler, InvalidInput, TextGeneration
from serving_core.device import resolve

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # kvrows and train, also when imported as handlers.textgen.handler

from kvrows import Row, Rows  # noqa: E402
from train import EOS, model_dir, token_id  # noqa: E402

Answer = dict[str, Any] | Final | InvalidInput | None


@dataclass(frozen=True)
class Request:
    """A request as the model thread gets it (``preprocess``'s answer)."""

    ids: list[int]  # the end-of-text token, then the prompt's tokens
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(eq=False)
class Running(Row):
    """A sequence's state between steps (``Generation.state``)."""

    request: Request
    text: str = ""  # generated so far
    sent: int = 0  # how much of ``text`` went out in chunks
    sampler: torch.Generator | None = None


class TextGenerator(Handler):
    name = "textgen"
    version = "1"
    # Sampled answers differ from one request to the next; greedy ones repeat,
    # but a cache entry per request is cheap next to nothing.
    cacheable = False
    text = TextGeneration(prompt="prompt", text="text")
    input_schema = {
        "type": "object",
        "properties": {
            "prompt": {"type": "string", "maxLength": 20_000},
            "max_tokens": {"type": "integer", "minimum": 1},
            "temperature": {"type": "number", "minimum": 0, "maximum": 2},
            "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "seed": {"type": "integer"},
            "stop": {
                "anyOf": [
                    {"type": "string", "minLength": 1},
                    {
                        "type": "array",
                        "items": {"type": "string", "minLength": 1},
                        "maxItems": 4,
                    },
                ]
            },
        },
        "required": ["prompt"],
    }

    def setup(self) -> None:
        where = model_dir()
        if not (where / "tokenizer.json").exists():
            # A process of its own: torch is held to one thread in this one.
            subprocess.run([sys.executable, str(HERE / "train.py"), str(where)], check=True)
        self.tokenizer = Tokenizer.from_file(str(where / "tokenizer.json"))
        self.model = GPT2LMHeadModel.from_pretrained(where).train(False)
        self.eos = token_id(self.tokenizer, EOS)
        self.context = int(self.model.config.n_positions)
        # Each token's own text: the text is ASCII, so no token is part of a character.
        self.pieces = [self.tokenizer.decode([i]) for i in range(self.tokenizer.get_vocab_size())]
        self.rows = Rows()

    def setup_worker(self) -> None:
        device = resolve(self.device)
        self.model = self.model.to(device)
        self.rows = Rows(device)

    def preprocess(self, params: dict[str, Any]) -> Request:
        stop = params.get("stop") or ()
        return Request(
            ids=[self.eos, *self.tokenizer.encode(params["prompt"]).ids],
            temperature=float(params.get("temperature") or 0.0),
            top_p=float(params.get("top_p") or 1.0),
            seed=params.get("seed"),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
        )

    def step(self, generations: list[Generation]) -> list[Answer]:
        running = [g for g in generations if g.state is not None]
        self.rows.keep([g.state for g in running])
        tokens: dict[int, int] = {}
        if running:
            with torch.inference_mode():
                logits = self.rows.decode(self.model)
            greedy = logits.argmax(dim=-1).tolist()
            for i, g in enumerate(running):
                tokens[id(g)] = self._pick(g.state, logits[i], greedy[i])
        answers: list[Answer] = []
        for g in generations:
            token = tokens[id(g)] if g.state is not None else self._prefill(g)
            answers.append(token if isinstance(token, InvalidInput) else self._emit(g, token))
        return answers

    def _prefill(self, g: Generation) -> int | InvalidInput:
        request: Request = g.item
        if len(request.ids) + g.max_tokens > self.context:
            return InvalidInput(
                f"the prompt is {len(request.ids) - 1} tokens and max_tokens {g.max_tokens}: "
                f"together more than this model's {self.context - 1}; shorten either"
            )
        cache = DynamicCache()
        ids = torch.tensor([request.ids], device=self.rows.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        state = Running(request=request)
        state.position = len(request.ids)
        if request.temperature > 0:
            state.sampler = torch.Generator(device=self.rows.device)
            if request.seed is None:
                state.sampler.seed()  # its default seed is a constant
            else:
                state.sampler.manual_seed(request.seed)
        self.rows.add(state, cache)
        g.state = state
        last = logits[0, -1]
        return self._pick(state, last, int(last.argmax()))

    def _pick(self, state: Running, logits: torch.Tensor, greedy: int) -> int:
        request = state.request
        if request.temperature == 0:
            return greedy
        probs = torch.softmax(logits.float() / request.temperature, dim=-1)
        if request.top_p < 1:
            # The fewest most likely tokens whose probabilities add up to top_p.
            ordered, order = probs.sort(descending=True)
            outside = ordered.cumsum(-1) - ordered >= request.top_p
            probs = probs.scatter(-1, order, ordered.masked_fill(outside, 0.0))
        return int(torch.multinomial(probs, 1, generator=state.sampler))

    def _emit(self, g: Generation, token: int) -> Answer:
        """The answer for ``token``: new text, held back while it may begin a stop
        string, or the end (end-of-text, a stop string, the context full)."""
        state: Running = g.state
        state.token = token
        if token == self.eos:
            return _final(state.text[state.sent :])
        state.text += self.pieces[token]
        for stop in state.request.stop:
            at = state.text.find(stop, max(0, state.sent - len(stop)))
            if at >= 0:
                return _final(state.text[state.sent : at])
        if state.position + 1 >= self.context:
            return _final(state.text[state.sent :])
        end = len(state.text)
        if g.tokens + 1 < g.max_tokens:  # the last chunk holds nothing back
            end -= _stop_prefix(state.text, state.request.stop)
        chunk, state.sent = state.text[state.sent : end], max(state.sent, end)
        return {"text": chunk} if chunk else None


def _final(text: str) -> Final:
    return Final({"text": text} if text else None)


def _stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """How many of ``text``'s last characters begin one of ``stops``."""
    return max(
        (n for stop in stops for n in range(len(stop) - 1, 0, -1) if text.endswith(stop[:n])),
        default=0,
    )
