"""V2's generate extension in process (``web/generateroutes`` over the generating test
handler): ``/generate``'s one answer, ``/generate_stream``'s events, the errors."""

from __future__ import annotations

import json

import pytest

from serving_core.errors import ServingError
from serving_core.generation import TextGeneration
from serving_core.v2.generate import TextGenerate
from tests.conftest import HANDLERS
from tests.generation import started_client

GENERATING = str(HANDLERS / "generating" / "handler.py")
MODEL = "/v2/models/generating"


@pytest.fixture(scope="module")
def client():
    with started_client() as started:
        yield started


def events(body: str) -> list[dict]:
    frames = [frame for frame in body.split("\n\n") if frame]
    assert all(frame.startswith("data: ") for frame in frames), body
    return [json.loads(frame[6:]) for frame in frames]


@pytest.mark.parametrize("path", [MODEL, f"{MODEL}/versions/0"])
def test_generate_answers_the_collected_text(client, path):
    answer = client.post(
        f"{path}/generate", json={"text_input": "a b", "parameters": {"max_tokens": 3}}
    )
    assert answer.status_code == 200
    assert answer.get_json() == {
        "model_name": "generating",
        "model_version": "0",
        "text_output": " a b a",
    }


def test_generate_stream_sends_each_chunk_then_why_it_ended(client):
    answer = client.post(
        f"{MODEL}/generate_stream",
        json={"text_input": "a b", "parameters": {"n": 3, "stream": True}},
    )
    assert answer.status_code == 200
    assert answer.mimetype == "text/event-stream"
    sent = events(answer.get_data(as_text=True))
    assert [e["text_output"] for e in sent] == [" a", " b", " a", ""]
    assert all(e["model_name"] == "generating" and e["model_version"] == "0" for e in sent)
    assert sent[-1]["finish_reason"] == "stop"
    assert "finish_reason" not in sent[0]


def test_keys_beside_text_input_are_parameters_too(client):
    answer = client.post(f"{MODEL}/generate", json={"text_input": "x", "max_tokens": 2})
    assert answer.get_json()["text_output"] == " x x"


def test_an_error_mid_stream_is_the_last_event(client):
    answer = client.post(
        f"{MODEL}/generate_stream", json={"text_input": "a", "parameters": {"fail_at": 1}}
    )
    assert answer.status_code == 200
    sent = events(answer.get_data(as_text=True))
    assert sent[0]["text_output"] == " a"
    assert list(sent[-1]) == ["error"]
    assert "request id" in sent[-1]["error"]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        (MODEL, {"parameters": {}}, 400),
        (MODEL, {"text_input": 3}, 400),
        (MODEL, {"text_input": "a", "parameters": [1]}, 400),
        (MODEL, {"text_input": "a", "parameters": {"max_tokens": 10**6}}, 400),
        (MODEL, {"text_input": "a", "parameters": {"bad_at": 0}}, 400),
        ("/v2/models/other", {"text_input": "a"}, 404),
        (f"{MODEL}/versions/9", {"text_input": "a"}, 404),
    ],
)
def test_an_error_before_the_first_chunk_is_a_json_error(client, route, path, body, status):
    answer = client.post(f"{path}/{route}", json=body)
    assert answer.status_code == status
    assert answer.mimetype == "application/json"
    error = answer.get_json()
    assert list(error) == ["error"]
    assert isinstance(error["error"], str)


def test_the_route_not_the_parameters_chooses_a_stream():
    generate = TextGenerate(None, TextGeneration(prompt="p"))  # params needs no model
    params = generate.params({"text_input": "t", "parameters": {"stream": False, "k": 1}})
    assert params == {"p": "t", "k": 1}
    assert TextGenerate.error(ServingError("broke")) == {"error": "broke"}
