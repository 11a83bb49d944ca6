"""Server-sent events from a generating handler, through the real server and the real
nginx: chunks one by one, a hang-up that stops the generation, an error mid-stream."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.nginx_server import nginx_server
from tests.servers import ROOT, Server, gunicorn_server, wait_for

pytestmark = pytest.mark.e2e

HANDLER = ROOT / "tests/handlers/generating/handler.py"
STREAM = {"Accept": "text/event-stream"}
WAIT_S = 60.0


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("generating") / "steps.jsonl"


@pytest.fixture(scope="module")
def server(record: Path) -> Iterator[Server]:
    env = {
        "SERVING_HANDLER": str(HANDLER),
        "SERVING_WORKERS": "1",
        "SERVING_MAX_BATCH_SIZE": "8",
        "GENERATING_RECORD": str(record),
    }
    with gunicorn_server(env) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(server: Server) -> Iterator[str]:
    with nginx_server(server.bind) as running:
        yield running.url


@pytest.fixture(scope="module", params=["direct", "nginx"])
def url(request: pytest.FixtureRequest, server: Server) -> str:
    if request.param == "direct":
        return server.url
    return str(request.getfixturevalue("proxy"))


def steps_of(record: Path, request_id: str) -> int:
    lines = record.read_text().splitlines() if record.exists() else []
    return sum(request_id in json.loads(line)["ids"] for line in lines)


def events(response: requests.Response) -> Iterator[dict[str, Any]]:
    """The SSE events of ``response``, each as it arrives: its fields, ``data`` parsed."""
    event: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
            continue
        name, _, value = line.decode().partition(": ")
        event[name] = json.loads(value) if name == "data" else value


def open_stream(url: str, body: dict[str, Any], request_id: str) -> requests.Response:
    response = requests.post(
        url + "/predict",
        json=body,
        headers={**STREAM, "X-Request-ID": request_id},
        stream=True,
        timeout=WAIT_S,
    )
    assert response.status_code == 200, response.text
    return response


def gone(server: Server) -> float:
    text = requests.get(server.url + "/metrics", timeout=10).text
    found = re.search(r'^serving_generations_total\{reason="gone"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_chunks_arrive_one_by_one_the_first_before_the_generation_ends(
    url: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    response = open_stream(url, {"n": 5, "gate": str(gate)}, uuid.uuid4().hex)
    assert response.headers["Content-Type"].startswith("text/event-stream")
    stream = events(response)
    # The handler waits at the gate after its first chunk: that chunk came first.
    first = next(stream)
    assert first["data"] == {"text": " w0"}
    assert not gate.exists()
    gate.touch()
    rest = list(stream)
    assert [e["data"]["text"] for e in rest[:-1]] == [" w1", " w2", " w3", " w4"]
    assert [e["id"] for e in [first, *rest[:-1]]] == ["1", "2", "3", "4", "5"]
    assert rest[-1] == {"event": "end", "data": {"finish_reason": "stop", "chunks": 5}}


def test_the_token_limit_ends_the_stream_with_length(url: str) -> None:
    response = open_stream(url, {"n": 50, "max_tokens": 3}, uuid.uuid4().hex)
    got = list(events(response))
    assert len(got) == 4
    assert got[-1]["data"] == {"finish_reason": "length", "chunks": 3}


def test_a_client_that_hangs_up_stops_its_generation_within_one_step(
    url: str, server: Server, record: Path, tmp_path: Path
) -> None:
    request_id = uuid.uuid4().hex
    gate = tmp_path / "gate"
    before = gone(server)
    with requests.Session() as session:
        response = session.post(
            url + "/predict",
            json={"n": 200, "gate": str(gate)},
            headers={**STREAM, "X-Request-ID": request_id},
            stream=True,
            timeout=WAIT_S,
        )
        assert next(events(response))["data"] == {"text": " w0"}
        # Its second step waits at the gate: the client hangs up meanwhile.
        response.close()
    wait_for(lambda: gone(server) > before, timeout_s=WAIT_S, what="the hang-up noticed")
    gate.touch()
    # Another generation runs after it: the decoder has moved past the one that left.
    after = open_stream(url, {"n": 3}, uuid.uuid4().hex)
    assert list(events(after))[-1]["event"] == "end"
    # The step in progress when it left was its last: 2 of its 200.
    assert steps_of(record, request_id) == 2


def test_an_error_mid_stream_is_a_final_error_event(url: str) -> None:
    response = open_stream(url, {"n": 10, "fail_at": 2}, uuid.uuid4().hex)
    got = list(events(response))
    assert [e["data"]["text"] for e in got[:-1]] == [" w0", " w1"]
    assert got[-1]["event"] == "error"
    assert got[-1]["data"]["error"]["type"] == "model_error"


def test_an_error_before_the_first_chunk_is_a_plain_http_error(url: str) -> None:
    response = requests.post(
        url + "/predict", json={"n": 2, "max_tokens": 10_000}, headers=STREAM, timeout=WAIT_S
    )
    assert response.status_code == 400
    assert "SERVING_MAX_TOKENS" in response.json()["error"]["message"]


def test_without_a_stream_predict_answers_the_whole_generation(url: str) -> None:
    response = requests.post(url + "/predict", json={"prompt": "a b c", "n": 4}, timeout=WAIT_S)
    assert response.status_code == 200
    assert response.json() == {"text": " a b c a"}


def waiting(server: Server) -> int:
    return int(requests.get(server.url + "/metadata", timeout=10).json()["batching"]["waiting"])


def test_requests_that_arrive_while_others_generate_join_their_steps(
    url: str, server: Server, record: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    long_id, short_id = uuid.uuid4().hex, uuid.uuid4().hex
    long = open_stream(url, {"n": 30, "gate": str(gate)}, long_id)
    long_events = events(long)
    next(long_events)  # the long one is generating: its second step waits at the gate
    with ThreadPoolExecutor(1) as pool:
        # Its headers come with its first chunk, after the gate: from a thread.
        short = pool.submit(lambda: list(events(open_stream(url, {"n": 3}, short_id))))
        wait_for(lambda: waiting(server) == 1, timeout_s=WAIT_S, what="the short one queued")
        gate.touch()
        assert short.result(WAIT_S)[-1]["data"]["finish_reason"] == "stop"
    assert list(long_events)[-1]["data"]["finish_reason"] == "stop"
    steps = [json.loads(line)["ids"] for line in record.read_text().splitlines()]
    mine = [ids for ids in steps if long_id in ids or short_id in ids]
    # It joined the running batch at the very next step (the one at the gate was in
    # progress when it arrived), and left after its 3 steps while the long one,
    # which started earlier, went on.
    assert [ids == [long_id] for ids in mine[:2]] == [True, True]
    assert mine[2:5] == [[long_id, short_id]] * 3
    assert all(ids == [long_id] for ids in mine[5:])
    assert len(mine) == 30


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"no {name} in /metrics"
    return float(found.group(1))


def test_metrics_count_first_tokens_inter_token_gaps_tokens_and_streams(
    url: str, server: Server
) -> None:
    before = requests.get(server.url + "/metrics", timeout=10).text
    list(events(open_stream(url, {"n": 4}, uuid.uuid4().hex)))
    after = requests.get(server.url + "/metrics", timeout=10).text
    for name, added in (
        ("serving_time_to_first_token_seconds_count", 1),
        ("serving_inter_token_latency_seconds_count", 3),
        ("serving_generated_tokens_total", 4),
        ('serving_generations_total{reason="stop"}', 1),
    ):
        assert metric(after, name) - metric(before, name) == added, name
    assert 'serving_active_generations{state="running"}' in after
    assert "serving_generation_step_duration_seconds_count" in after


def test_the_gthread_worker_streams_too(tmp_path: Path) -> None:
    env = {
        "SERVING_HANDLER": str(HANDLER),
        "SERVING_WORKERS": "1",
        "SERVING_WORKER_CLASS": "gthread",
    }
    gate = tmp_path / "gate"
    with gunicorn_server(env) as threaded:
        stream = events(open_stream(threaded.url, {"n": 3, "gate": str(gate)}, uuid.uuid4().hex))
        assert next(stream)["data"] == {"text": " w0"}
        gate.touch()
        assert [e.get("event") for e in stream] == [None, None, "end"]
