"""What an OpenAI request asks of the text generator: its parameters, mapped."""

from __future__ import annotations

import pytest

from serving_core.generation import chat_prompt
from serving_core.openai import asked
from serving_core.openai.errors import BadField, ModelNotFound


def test_the_sampling_fields_and_the_token_limit_reach_the_handler_under_their_names():
    request = asked.completion(
        {
            "model": "m",
            "prompt": "hi",
            "max_tokens": 9,
            "temperature": 0.5,
            "top_p": 0.9,
            "stop": ["\n"],
            "seed": 7,
            "top_k": 4,  # the client's extra_body: the handler's own
            "frequency_penalty": 0.0,  # the API's: not the handler's
            "user": "someone",
            "logprobs": None,
        },
        "m",
        "text_in",
    )
    assert request.params == {
        "text_in": "hi",
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["\n"],
        "seed": 7,
        "top_k": 4,
    }
    assert (request.stream, request.include_usage) == (False, False)


def test_fields_sent_as_null_are_left_out():
    request = asked.completion(
        {"model": "m", "prompt": "hi", "max_tokens": None, "temperature": None, "n": None},
        "m",
        "prompt",
    )
    assert request.params == {"prompt": "hi"}


def test_max_completion_tokens_wins_over_max_tokens():
    request = asked.chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 50,
            "max_completion_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        "m",
        "prompt",
        chat_prompt,
    )
    assert request.params == {"prompt": "user: hi\nassistant:", "max_tokens": 5}
    assert (request.stream, request.include_usage) == (True, True)


def test_a_chats_text_parts_are_joined_and_none_content_is_empty():
    seen = []

    def prompt(messages):
        seen.extend(messages)
        return "p"

    asked.chat(
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None, "name": "bot"},
            ],
        },
        "m",
        "prompt",
        prompt,
    )
    assert seen == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "", "name": "bot"},
    ]


def test_the_prompt_field_cannot_be_overridden_by_an_extra_field():
    request = asked.chat(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "prompt": "sneaky"},
        "m",
        "prompt",
        chat_prompt,
    )
    assert request.params["prompt"] == "user: x\nassistant:"


def test_another_model_is_not_found_and_a_missing_one_is_a_bad_field():
    with pytest.raises(ModelNotFound):
        asked.completion({"model": "other", "prompt": "p"}, "m", "prompt")
    with pytest.raises(BadField) as missing:
        asked.completion({"prompt": "p"}, "m", "prompt")
    assert missing.value.param == "model"
