"""The contract of a handler that generates: its answer in chunks, sent as they come.

A handler generates when it overrides ``Handler.generate`` (the simple form)
or ``Handler.step`` (the batched form, continuous batching):

- ``generate(item)`` yields one request's chunks. The engine advances each
  running request's generator by one chunk per step, in turn, on the model
  thread, so a new request starts between two chunks of the others.
- ``step(generations)`` runs one model step for every running ``Generation``
  at once and answers one slot per generation. The engine owns the schedule:
  a new request joins between two steps (its first step, ``steps == 0``, is
  its prefill), and one that ends, runs out of tokens or time, or whose
  client hangs up leaves before the next step. ``Generation.state`` is the
  handler's own place for what a sequence carries from step to step (its
  KV cache, its last token).

A slot's answer is a chunk (a dict, as ``predict``'s output), ``None`` (no
chunk this step), ``Final(chunk)`` (the last one; ``Final()`` ends with no
chunk) or an ``InvalidInput`` (this request fails with a 400; the others go
on). An exception from ``step`` fails every generation in that step.

Every path serves a generating handler: online, chunks stream as server-sent
events (``Accept: text/event-stream``), V2's ``generate_stream`` and, for a
``TextGeneration``, OpenAI's ``stream: true``; ``/predict`` without it, jobs,
``serving-core batch``, the stream worker and pipelines get ``collect``'s
one answer made of all the chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from serving_core.context import Context

Output = dict[str, Any]

#: The parameter that carries a request's own token limit, as OpenAI's API names it;
#: SERVING_MAX_TOKENS caps it and applies without it.
MAX_TOKENS = "max_tokens"


@dataclass(eq=False)
class Generation:
    """One request's sequence, as ``Handler.step`` sees it."""

    item: Any  # what ``preprocess`` returned for it
    context: Context  # its request id and the deadline of its first chunk
    max_tokens: int  # the chunks it may have: its ``max_tokens``, capped by SERVING_MAX_TOKENS
    state: Any = None  # the handler's own: None at its first step
    steps: int = 0  # steps it took before this one: 0 at its first (the prefill)
    tokens: int = 0  # chunks it has had
    # The simple form's generator, kept by the engine; the batched form leaves it None.
    iterator: Any = field(default=None, repr=False)


@dataclass(frozen=True)
class Final:
    """A generation's last chunk (``Final()``: it ends with no chunk of its own)."""

    chunk: Output | None = None


@dataclass(frozen=True)
class TextGeneration:
    """Declares a generating handler a text generator (``Handler.text``), so that the
    OpenAI-compatible routes (``/v1/completions``, ``/v1/chat/completions``) and V2's
    ``generate`` routes serve it.

    ``prompt``: the parameter that carries the prompt; ``text``: the chunk field that
    carries the new text. Other parameters of those APIs (``temperature``,
    ``top_p``, ``stop``, ``seed``) reach the handler under their own names when sent.
    """

    prompt: str = "prompt"
    text: str = "text"


def join_chunks(chunks: Sequence[Output]) -> Output:
    """``Handler.collect``'s default: a field whose chunks are all strings is their
    concatenation (the text); any other field, the list of its values in order."""
    fields: dict[str, list[Any]] = {}
    for chunk in chunks:
        for key, value in chunk.items():
            fields.setdefault(key, []).append(value)
    return {
        key: "".join(values) if all(isinstance(v, str) for v in values) else values
        for key, values in fields.items()
    }


def chat_prompt(messages: Sequence[dict[str, Any]]) -> str:
    """``Handler.chat_prompt``'s default: each message a ``role: content`` line, then
    ``assistant:`` for the model to go on from. A model trained on a template of its
    own (a tokenizer's ``apply_chat_template``) overrides it."""
    lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
    return "\n".join([*lines, "assistant:"])
