"""OpenAI's API in process (``web/openairoutes`` over the generating test handler): the
mapping of requests and answers, the stream's events and the error shape. The
``openai`` client against a real server: tests/web/test_openai_client.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import HANDLERS, make_app
from tests.generation import started_client

GENERATING = str(HANDLERS / "generating" / "handler.py")
MODEL = "generating"


@pytest.fixture(scope="module")
def client():
    with started_client() as started:
        yield started


def events(body: str) -> list[Any]:
    """Each ``data:`` event of an SSE body, JSON decoded ("[DONE]" as it is)."""
    frames = [frame for frame in body.split("\n\n") if frame]
    assert all(frame.startswith("data: ") for frame in frames), body
    return [frame[6:] if frame == "data: [DONE]" else json.loads(frame[6:]) for frame in frames]


def test_a_completion_is_the_generations_text_with_its_end_and_usage(client):
    answer = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 4}
    )
    assert answer.status_code == 200
    body = answer.get_json()
    assert body["object"] == "text_completion"
    assert body["model"] == MODEL
    assert body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {"index": 0, "text": " a b c a", "logprobs": None, "finish_reason": "length"}
    ]
    assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 4, "total_tokens": 4}


def test_a_generation_that_ends_itself_finishes_with_stop(client):
    body = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": ["x"], "n": 1, "extra": 0}
    ).get_json()
    assert body["choices"][0]["text"] == " x" * 8
    assert body["choices"][0]["finish_reason"] == "stop"


def test_a_chat_is_answered_from_the_handlers_chat_prompt(client):
    body = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ],
            "max_completion_tokens": 4,
        },
    ).get_json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    # The default chat_prompt: "system: sys\nuser: hi\nassistant:", its words in turn.
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": " system: sys user: hi",
    }
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4


def test_a_chat_stream_sends_each_chunk_then_the_end_the_usage_and_done(client):
    answer = client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert answer.status_code == 200
    assert answer.mimetype == "text/event-stream"
    assert answer.headers["X-Accel-Buffering"] == "no"
    sent = events(answer.get_data(as_text=True))
    assert sent[-1] == "[DONE]"
    chunks, end, usage = sent[:3], sent[3], sent[4]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": " user:"},
        {"content": " hi"},
        {"content": " assistant:"},
    ]
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks)
    assert len({c["id"] for c in sent[:-1]}) == 1
    assert end["choices"] == [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    ]
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 0, "completion_tokens": 3, "total_tokens": 3}


def test_a_completion_stream_without_usage_has_none(client):
    answer = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "p", "n": 2 - 1, "stream": True}
    )
    sent = events(answer.get_data(as_text=True))
    assert sent[-1] == "[DONE]"
    assert [c["choices"][0]["text"] for c in sent[:-1]] == [" p"] * 8 + [""]
    assert sent[-2]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in sent[:-1])


def test_an_error_mid_stream_is_the_last_event_in_openais_shape(client):
    answer = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "p", "fail_at": 2, "stream": True}
    )
    assert answer.status_code == 200
    sent = events(answer.get_data(as_text=True))
    assert [c["choices"][0]["text"] for c in sent[:2]] == [" p", " p"]
    assert len(sent) == 3  # no [DONE] after an error
    error = sent[2]["error"]
    assert error["type"] == "server_error"
    assert error["code"] == "model_error"
    assert "request id" in error["message"]


def test_an_error_mid_generation_without_a_stream_is_the_responses_error(client):
    answer = client.post("/v1/completions", json={"model": MODEL, "prompt": "p", "fail_at": 2})
    assert answer.status_code == 500
    assert answer.get_json()["error"]["code"] == "model_error"


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": MODEL, "prompt": "p", "n": 2}, 400, "n", "bad_request"),
        ({"model": MODEL, "prompt": [1, 2]}, 400, "prompt", "bad_request"),
        ({"model": MODEL}, 400, "prompt", "bad_request"),
        ({"prompt": "p"}, 400, "model", "bad_request"),
        ({"model": "gpt-4", "prompt": "p"}, 404, None, "model_not_found"),
        ({"model": MODEL, "prompt": "p", "max_tokens": 10**6}, 400, None, "invalid_input"),
        ({"model": MODEL, "prompt": "p", "stream": "yes"}, 400, "stream", "bad_request"),
        ({"model": MODEL, "prompt": "p", "n": 3, "stream": True}, 400, "n", "bad_request"),
    ],
)
def test_a_refused_completion_is_an_error_in_openais_shape(client, body, status, param, code):
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == status
    assert answer.mimetype == "application/json"
    error = answer.get_json()["error"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)
    assert error["message"]


@pytest.mark.parametrize(
    "messages",
    [[], "hi", [{"content": "no role"}], [{"role": "user", "content": [{"type": "image_url"}]}]],
)
def test_chat_messages_the_model_cannot_read_are_refused(client, messages):
    answer = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert answer.status_code == 400
    assert answer.get_json()["error"]["param"] == "messages"


def test_the_models_are_the_served_one(client):
    listed = client.get("/v1/models").get_json()
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == [MODEL]
    assert client.get(f"/v1/models/{MODEL}").get_json()["id"] == MODEL
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404
    assert missing.get_json()["error"]["code"] == "model_not_found"


def test_any_v1_error_takes_openais_shape(client):
    missing = client.get("/v1/nowhere")
    assert missing.status_code == 404
    assert missing.get_json()["error"]["type"] == "invalid_request_error"
    wrong = client.get("/v1/completions")
    assert wrong.status_code == 405
    assert set(wrong.get_json()["error"]) == {"message", "type", "param", "code"}
    malformed = client.post("/v1/completions", data=b"{", content_type="application/json")
    assert malformed.status_code == 400
    assert "malformed JSON" in malformed.get_json()["error"]["message"]


def test_the_openapi_document_describes_the_text_routes(client):
    from openapi_spec_validator import validate

    document = client.get("/openapi.json").get_json()
    validate(document)
    paths = document["paths"]
    for path in (
        "/v1/models",
        "/v1/completions",
        "/v1/chat/completions",
        "/v2/models/{name}/generate",
        "/v2/models/{name}/versions/{version}/generate_stream",
    ):
        assert path in paths
    streamed = paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert "text/event-stream" in streamed


def test_a_handler_that_does_not_generate_text_serves_neither_api():
    app = make_app(max_wait_ms=1)
    plain = app.test_client()
    for path in ("/v1/models", "/v2/models/probe/generate"):
        answer = plain.get(path) if path.startswith("/v1") else plain.post(path, json={})
        assert answer.status_code == 404
    # Outside OpenAI's API, /v1 keeps the app's own error shape.
    assert set(plain.get("/v1/models").get_json()["error"]) == {"type", "message"}
    document = plain.get("/openapi.json").get_json()
    assert not [p for p in document["paths"] if p.startswith("/v1") or "generate" in p]
