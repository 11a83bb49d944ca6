"""The official ``openai`` client, unchanged, against a real server of a text generator
(tests/handlers/generating), with an API key: streamed and whole completions and
chats, and the errors it raises, before a stream and in one."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.generation import ENV, full_queue
from tests.nginx_server import nginx_server
from tests.servers import Server, gunicorn_server

pytestmark = pytest.mark.e2e
KEY = "test-openai-key-0123456789"
MODEL = "generating"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with gunicorn_server({**ENV, "SERVING_API_KEYS": KEY}) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(server: Server) -> Iterator[str]:
    with nginx_server(server.bind) as running:
        yield running.url


@pytest.fixture(params=["direct", "nginx"])
def client(request: pytest.FixtureRequest, server: Server) -> Iterator[openai.OpenAI]:
    base = server.url if request.param == "direct" else request.getfixturevalue("proxy")
    # No retries: a test sees each answer the server gives.
    with openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0) as opened:
        yield opened


def test_the_client_streams_a_chat_completion(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == " user: hi assistant:"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3


def test_the_client_streams_a_completion(client):
    stream = client.completions.create(model=MODEL, prompt="one two", max_tokens=6, stream=True)
    chunks = list(stream)
    assert [c.choices[0].text for c in chunks] == [" one", " two"] * 3 + [""]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "text_completion" and c.model == MODEL for c in chunks)


def test_the_client_gets_a_whole_chat_completion_and_completion(client):
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=2
    )
    assert chat.choices[0].message.content == " user: hi"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 2
    completion = client.completions.create(model=MODEL, prompt="x", extra_body={"n": 1})
    assert completion.choices[0].text == " x" * 8
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.total_tokens == 8


def test_the_client_lists_the_model(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_an_error_mid_stream_is_raised_after_the_chunks_before_it(client):
    got = []

    def read_all() -> None:
        for chunk in client.completions.create(
            model=MODEL, prompt="p", stream=True, extra_body={"fail_at": 2}
        ):
            got.append(chunk.choices[0].text)

    with pytest.raises(openai.APIError) as failed:
        read_all()
    assert got == [" p", " p"]
    assert failed.value.code == "model_error"
    assert "request id" in failed.value.message


def test_errors_before_the_stream_are_the_clients_exceptions(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="p", stream=True)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="p", n=2)
    assert refused.value.param == "n"
    with pytest.raises(openai.BadRequestError) as invalid:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "p"}],
            stream=True,
            extra_body={"bad_at": 0},
        )
    assert invalid.value.status_code == 400


def test_a_wrong_key_is_an_authentication_error(server):
    stranger = openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="not-the-key-0123456789", max_retries=0
    )
    with stranger, pytest.raises(openai.AuthenticationError) as refused:
        stranger.models.list()
    assert refused.value.type == "authentication_error"


def test_a_full_worker_refuses_at_once_with_retry_after(server, client, tmp_path):
    gate = tmp_path / "gate"
    with (
        full_queue(server, gate, {"Authorization": f"Bearer {KEY}"}),
        pytest.raises(openai.InternalServerError) as refused,
    ):
        client.completions.create(model=MODEL, prompt="p", stream=True)
    assert refused.value.status_code == 503
    assert refused.value.code == "overloaded"
    assert int(refused.value.response.headers["Retry-After"]) >= 1
