"""What an OpenAI request asks: the text generator's parameters, and how to answer.

The prompt (a completion's ``prompt``, or a chat's ``messages`` through
``Handler.chat_prompt``) goes to ``TextGeneration.prompt``; ``max_tokens`` (or
``max_completion_tokens``) to the token limit; ``temperature``, ``top_p``,
``stop`` and ``seed`` under their own names, when sent. One choice per request
(``n`` 1); the API's other fields are not the handler's and are left out. A field
the API does not know (the ``openai`` client's ``extra_body``) is the handler's
own parameter, passed on as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serving_core.errors import quote
from serving_core.generation import MAX_TOKENS
from serving_core.handler import Params
from serving_core.openai.errors import BadField, ModelNotFound

# Sampling fields passed to the handler under their own names.
SAMPLING = ("temperature", "top_p", "stop", "seed")
# The API's own fields: never a handler's parameter (the mapped ones are mapped).
API_FIELDS = frozenset(
    {
        "model", "prompt", "messages", "n", "stream", "stream_options", "max_tokens",
        "max_completion_tokens", "frequency_penalty", "presence_penalty", "logprobs",
        "top_logprobs", "logit_bias", "user", "echo", "suffix", "best_of", "response_format",
        "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "store",
        "metadata", "service_tier", "modalities", "audio", "prediction", "reasoning_effort",
        "web_search_options", "safety_identifier", "prompt_cache_key", "verbosity",
        *SAMPLING,
    }
)  # fmt: skip
ChatPrompt = Callable[[list[dict[str, Any]]], str]


@dataclass(frozen=True)
class Asked:
    params: Params  # the handler's
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage


def completion(body: dict[str, Any], model: str, prompt_key: str) -> Asked:
    """``/v1/completions``: one prompt, as a string (or a list of one)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadField(
            "prompt must be one string (token arrays and several prompts are not "
            'served); send e.g. "prompt": "Once upon a time"',
            param="prompt",
        )
    return _asked(body, model, prompt_key, prompt)


def chat(body: dict[str, Any], model: str, prompt_key: str, chat_prompt: ChatPrompt) -> Asked:
    """``/v1/chat/completions``: the messages made one prompt by the handler."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadField(
            'messages must be a non-empty list; send e.g. "messages": '
            '[{"role": "user", "content": "Hello"}]',
            param="messages",
        )
    plain = [_message(m, i) for i, m in enumerate(messages)]
    return _asked(body, model, prompt_key, chat_prompt(plain))


def check_model(asked: Any, model: str) -> None:
    """Raise unless ``asked`` names the served model (``model`` is required, as OpenAI's)."""
    if not isinstance(asked, str):
        raise BadField(
            f'model must be a string, the model\'s id; send "model": "{model}"', param="model"
        )
    if asked != model:
        raise ModelNotFound(
            f"The model {quote(asked)} does not exist; this server serves {model!r} "
            "(GET /v1/models lists it)"
        )


def _message(message: Any, index: int) -> dict[str, Any]:
    """A chat message with its content as one string (text parts joined)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadField(
            f'{where} must be an object with a role; send e.g. {{"role": "user", '
            '"content": "Hello"}',
            param="messages",
        )
    content = message.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        texts = [p["text"] for p in content if _text_part(p)]
        if len(texts) != len(content):
            raise BadField(
                f"{where}.content holds a part that is not text; this model reads "
                "text only: send content as a string or text parts",
                param="messages",
            )
        content = "\n".join(texts)
    elif not isinstance(content, str):
        raise BadField(
            f"{where}.content must be a string or a list of text parts", param="messages"
        )
    return {**message, "content": content}


def _text_part(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def _asked(body: dict[str, Any], model: str, prompt_key: str, prompt: str) -> Asked:
    check_model(body.get("model"), model)
    params: Params = {k: v for k, v in body.items() if k not in API_FIELDS}
    params[prompt_key] = prompt
    n = body.get("n")
    if n is not None and n != 1:
        raise BadField(
            f"n={quote(n)}: this server answers one choice a request; send n 1", param="n"
        )
    limit = body.get("max_completion_tokens")
    if limit is None:
        limit = body.get(MAX_TOKENS)
    if limit is not None:
        params[MAX_TOKENS] = limit  # checked by the engine against SERVING_MAX_TOKENS
    for name in SAMPLING:
        if body.get(name) is not None:
            params[name] = body[name]
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadField("stream must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadField(
            'stream_options must be an object: {"include_usage": true}', param="stream_options"
        )
    include_usage = bool(options and options.get("include_usage"))
    return Asked(params, bool(stream), include_usage)
