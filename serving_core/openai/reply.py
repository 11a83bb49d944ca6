"""The objects of an OpenAI answer: a whole completion (``text_completion``,
``chat.completion``), a stream's chunks (``text_completion``,
``chat.completion.chunk``), the usage and the model list.

A stream's chunk carries one generated chunk's text; the end is one more chunk
with no text and its ``finish_reason`` (``stop`` or ``length``, as the
generation ended), then, with ``stream_options.include_usage``, a chunk of no
choices and the usage. ``completion_tokens`` counts the chunks; the prompt is
not tokenised here, so ``prompt_tokens`` is 0.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any

from serving_core.engine.stepper import Chunk, End, Event
from serving_core.errors import ServingError
from serving_core.handler import Output
from serving_core.openai import errors

OWNER = "serving-core"


class Kind(Enum):
    COMPLETION = "text_completion"
    CHAT = "chat.completion"


class Reply:
    """One request's answer: its id, creation time and model, the same in every chunk."""

    def __init__(self, kind: Kind, model: str, request_id: str, text: str) -> None:
        self.kind = kind
        self.model = model
        self.text = text  # the chunk field of the new text (``TextGeneration.text``)
        prefix = "chatcmpl" if kind is Kind.CHAT else "cmpl"
        self.id = f"{prefix}-{request_id}"
        self.created = int(time.time())
        self._role_sent = False

    def whole(self, chunks: list[Output], reason: str) -> dict[str, Any]:
        """The answer without a stream: every chunk's text, the end and the usage."""
        text = "".join(self._text(chunk) for chunk in chunks)
        if self.kind is Kind.CHAT:
            choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
        else:
            choice = {"text": text}
        choice.update(index=0, logprobs=None, finish_reason=reason)
        return {**self._head(self.kind.value), "choices": [choice], "usage": usage(len(chunks))}

    def events(self, event: Event, sent: int, include_usage: bool) -> list[dict[str, Any]]:
        """The stream's objects for one event; ``sent``: the chunks sent so far."""
        if isinstance(event, Chunk):
            return [self._chunk(self._text(event.output), None, include_usage)]
        if isinstance(event, End):
            last = [self._chunk(None, event.reason, include_usage)]
            if include_usage:
                last.append({**self._chunk_head(), "choices": [], "usage": usage(sent)})
            return last
        return [error(event)]

    def _chunk(self, text: str | None, reason: str | None, include_usage: bool) -> dict[str, Any]:
        choice: dict[str, Any]
        if self.kind is Kind.CHAT:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if not self._role_sent:
                delta["role"] = "assistant"
                self._role_sent = True
            choice = {"delta": delta}
        else:
            choice = {"text": text or ""}
        choice.update(index=0, logprobs=None, finish_reason=reason)
        chunk = {**self._chunk_head(), "choices": [choice]}
        if include_usage:
            chunk["usage"] = None  # as OpenAI's: only the last chunk has it
        return chunk

    def _chunk_head(self) -> dict[str, Any]:
        return self._head("chat.completion.chunk" if self.kind is Kind.CHAT else self.kind.value)

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _text(self, chunk: Output) -> str:
        value = chunk.get(self.text, "")
        return value if isinstance(value, str) else str(value)


def usage(completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": 0,
        "completion_tokens": completion_tokens,
        "total_tokens": completion_tokens,
    }


def error(exc: ServingError) -> dict[str, Any]:
    """A stream's last event when the generation fails after its first chunk."""
    return errors.body(exc.status, exc.message, exc.type)


def model_object(model: str, created: int) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": created, "owned_by": OWNER}


def model_list(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(model, created)]}
