"""V2's generate extension on a real server of a text generator
(tests/handlers/generating), as a client without a V2 library sees it: ``requests``
and the server-sent events as they come off the wire."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from tests.generation import ENV, full_queue
from tests.nginx_server import nginx_server
from tests.servers import Server, gunicorn_server

pytestmark = pytest.mark.e2e
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with gunicorn_server(ENV) as running:
        yield running
        log = running.output()
    # The one traceback is the handler's own failure at fail_at.
    assert log.count("Traceback") <= 1, log[-4000:]


def url(server: Server, route: str, model: str = "generating") -> str:
    return f"{server.url}/v2/models/{model}/{route}"


def data_events(response: requests.Response) -> list[dict]:
    lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith(b"data: ") for line in lines), lines
    return [json.loads(line[6:]) for line in lines]


def test_generate_answers_one_json_object(server):
    answer = requests.post(
        url(server, "generate"),
        data=json.dumps({"text_input": "a b", "parameters": {"max_tokens": 3}}),
        timeout=TIMEOUT_S,
    )  # no Content-Type, as curl -d sends it: the body is JSON all the same
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {
        "model_name": "generating",
        "model_version": "0",
        "text_output": " a b a",
    }


def test_generate_stream_sends_each_chunk_as_an_event(server):
    with requests.post(
        f"{server.url}/v2/models/generating/versions/0/generate_stream",
        json={"text_input": "a b", "parameters": {"n": 3}},
        stream=True,
        timeout=TIMEOUT_S,
    ) as answer:
        assert answer.status_code == 200
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        sent = data_events(answer)
    assert [e["text_output"] for e in sent] == [" a", " b", " a", ""]
    assert sent[-1]["finish_reason"] == "stop"


def test_an_error_mid_stream_ends_the_stream_with_an_error_event(server):
    with requests.post(
        url(server, "generate_stream"),
        json={"text_input": "a", "parameters": {"fail_at": 2}},
        stream=True,
        timeout=TIMEOUT_S,
    ) as answer:
        assert answer.status_code == 200
        sent = data_events(answer)
    assert [e.get("text_output") for e in sent[:2]] == [" a", " a"]
    assert list(sent[-1]) == ["error"]
    assert len(sent) == 3


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_errors_before_the_stream_are_json_errors(server, route, tmp_path):
    bad = requests.post(url(server, route), json={"parameters": {}}, timeout=TIMEOUT_S)
    missing = requests.post(
        url(server, route, "other"), json={"text_input": "a"}, timeout=TIMEOUT_S
    )
    with full_queue(server, tmp_path / "gate", {}):
        full = requests.post(url(server, route), json={"text_input": "a"}, timeout=TIMEOUT_S)
    for answer, status in ((bad, 400), (missing, 404), (full, 503)):
        assert answer.status_code == status
        assert answer.headers["Content-Type"] == "application/json"
        assert isinstance(answer.json()["error"], str)
    assert int(full.headers["Retry-After"]) >= 1


def test_generate_and_generate_stream_answer_alike_through_nginx(server, tmp_path):
    gate = tmp_path / "gate"
    with nginx_server(server.bind) as proxy:
        base = f"{proxy.url}/v2/models/generating"
        whole = requests.post(
            f"{base}/generate", json={"text_input": "a b", "parameters": {"n": 3}}, timeout=30
        )
        assert whole.json()["text_output"] == " a b a"
        body = {"text_input": "a b", "parameters": {"n": 3, "gate": str(gate)}}
        with requests.post(
            f"{base}/generate_stream", json=body, stream=True, timeout=TIMEOUT_S
        ) as answer:
            lines = (line for line in answer.iter_lines() if line)
            # The handler waits at the gate after its first chunk: that chunk came first.
            assert json.loads(next(lines)[6:])["text_output"] == " a"
            gate.touch()
            rest = [json.loads(line[6:]) for line in lines]
    assert [event["text_output"] for event in rest] == [" b", " a", ""]
