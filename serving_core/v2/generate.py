"""V2's generate extension (Triton's and KServe's ``/generate`` and
``/generate_stream``) for a text generator, without a wire.

A request is a JSON object: ``text_input`` (the prompt), ``parameters`` (the
handler's parameters: ``max_tokens``, ``temperature``...) and any other key,
passed on as a parameter too. An answer, whole or one per chunk, is
``model_name``, ``model_version``, ``text_output`` (the chunk's text field)
and the chunk's other fields. A stream ends with an answer of no text and its
``finish_reason`` (``stop`` or ``length``), or with ``{"error": "..."}``.
"""

from __future__ import annotations

from typing import Any

from serving_core.errors import BadRequest, ServingError
from serving_core.generation import TextGeneration
from serving_core.handler import Output, Params
from serving_core.v2.model import Model

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
PARAMETERS = "parameters"
# Triton's switch between one answer and many: here the route chooses, so a
# handler never sees it.
_ROUTE_CHOOSES = frozenset({"stream"})
EXAMPLE = '{"text_input": "Once upon a time", "parameters": {"max_tokens": 16}}'


class TextGenerate:
    def __init__(self, model: Model, text: TextGeneration) -> None:
        self.model = model
        self.text = text

    def params(self, body: dict[str, Any]) -> Params:
        """The handler's parameters from a generate request's JSON object."""
        text_input = body.get(TEXT_INPUT)
        if not isinstance(text_input, str):
            raise BadRequest(f"{TEXT_INPUT} must be a string, the prompt; send e.g. {EXAMPLE}")
        parameters = body.get(PARAMETERS)
        if parameters is None:
            parameters = {}
        if not isinstance(parameters, dict):
            raise BadRequest(f"{PARAMETERS} must be an object of named values; send e.g. {EXAMPLE}")
        params = {k: v for k, v in body.items() if k not in (TEXT_INPUT, PARAMETERS)}
        params.update((k, v) for k, v in parameters.items() if k not in _ROUTE_CHOOSES)
        params[self.text.prompt] = text_input
        return params

    def answer(self, output: Output) -> dict[str, Any]:
        """A generate response: the collected answer, or one chunk of a stream."""
        body: dict[str, Any] = {
            "model_name": self.model.name,
            "model_version": self.model.version,
        }
        fields = dict(output)
        body[TEXT_OUTPUT] = fields.pop(self.text.text, "")
        for key, value in fields.items():
            body.setdefault(key, value)
        return body

    def end(self, reason: str) -> dict[str, Any]:
        """A stream's last answer: no text, and why it ended."""
        return {**self.answer({}), "finish_reason": reason}

    @staticmethod
    def error(exc: ServingError) -> dict[str, Any]:
        """V2's error object, as a stream's last event."""
        return {"error": exc.message}
