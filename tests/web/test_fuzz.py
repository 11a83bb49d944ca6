"""Fuzzing a real server: schemathesis over /openapi.json, and hypothesis with hostile bytes.

One ``serving-core serve`` (gunicorn, gevent, the fuzz handler in
tests/handlers/fuzz) takes every case. What must hold for each:

- no 5xx, and no traceback in any response;
- every 4xx is the project's JSON error (``{"error": {"type": ..., "message": ...}}``);
- at the end, the server's log holds no traceback either.

``make test`` runs a few cases per test (FUZZ_EXAMPLES, default 15); ``make
fuzz`` runs 1,000 per test. Hypothesis keeps no database here (a CI clone has
none to reuse), so every run draws afresh.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.conftest import HANDLERS
from tests.servers import Server, gunicorn_server

FUZZ = str(HANDLERS / "fuzz/handler.py")
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "15"))
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a real server on a shared machine: time is not the property
    database=None,
    suppress_health_check=list(HealthCheck),
)
TIMEOUT_S = 30

pytestmark = [
    pytest.mark.e2e,
    # A failing multi-megabyte body is reported shortened by assert_clean; the
    # falsifying example's own repr is too long for hypothesis's taste.
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {
        "SERVING_HANDLER": FUZZ,
        "SERVING_WORKERS": "1",
        "SERVING_CACHE_SIZE": "0",
        "SERVING_JOBS_PATH": str(tmp_path_factory.mktemp("fuzz") / "jobs.db"),
    }
    with gunicorn_server(env) as running:
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback while fuzzed:\n{log[-4000:]}"


def assert_clean(
    status: int,
    content_type: str,
    body: bytes,
    what: object,
    *,
    own_deadline: bool = False,
    v2: bool = False,
) -> None:
    """``own_deadline``: the request set X-Request-Timeout, so a 504 (its deadline
    passed) or a 503 (predicted to miss it, from the headers alone) is the
    documented answer to the deadline it chose (1e-300 s cannot be met), not a
    server fault. ``v2``: a path under /v2, whose errors are the Open Inference
    Protocol's ``{"error": "message"}``."""
    text = body.decode("utf-8", "replace")
    if own_deadline and status in (503, 504):
        message = json.loads(body)["error"]
        if not v2:
            # OpenAI's shape (/v1) says our type in its ``code``.
            kind = message["code"] if "code" in message else message["type"]
            assert kind == ("deadline_exceeded" if status == 504 else "overloaded")
            message = message["message"]
        assert "deadline" in message, text
        return
    assert status < 500, f"{what!r} got {status}: {text[:500]}"
    assert "Traceback" not in text, f"{what!r} leaked a traceback"
    assert 'File "' not in text, f"{what!r} leaked a stack frame"
    if status >= 400:
        assert content_type.startswith("application/json"), (
            f"{what!r} got {status} as {content_type!r}, not a JSON error: {text[:300]}"
        )
        error = json.loads(body)["error"]
        if v2:
            assert isinstance(error, str), error
            return
        assert isinstance(error["type"], str), error
        assert isinstance(error["message"], str), error


# -- schemathesis: every operation of /openapi.json ---------------------------


def schema_cases(url: str) -> tuple[set[str], st.SearchStrategy[Any]]:
    """The paths of the live /openapi.json at ``url``, and cases for every operation,
    valid and invalid alike.

    Through schemathesis's Python API rather than its pytest plugin, which does
    not load under this pytest."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 4, [op.label for op in operations]
    strategy = st.one_of(
        [op.as_strategy(generation_mode=mode) for op in operations for mode in GenerationMode]
    )
    return {op.path for op in operations}, strategy


def call_clean(case: Any) -> None:
    """Send a schemathesis case; its answer must be clean (``assert_clean``)."""
    response = case.call(timeout=TIMEOUT_S)
    assert_clean(
        response.status_code,
        response.headers.get("content-type", [""])[0],
        response.content,
        (case.method, case.formatted_path, case.headers, case.query, case.body),
        own_deadline="X-Request-Timeout" in (case.headers or {}),
        v2=case.formatted_path.startswith("/v2"),
    )


@pytest.fixture(scope="module")
def generated_requests(server: Server) -> st.SearchStrategy[Any]:
    return schema_cases(server.url)[1]


@FUZZ_SETTINGS
@given(data=st.data())
def test_no_operation_answers_a_generated_request_with_a_5xx_or_a_traceback(
    generated_requests: st.SearchStrategy[Any], data: st.DataObject
) -> None:
    call_clean(data.draw(generated_requests))


# -- hypothesis: what a schema cannot describe --------------------------------

JSON_LEAVES = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=50)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


def deep(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


HOSTILE_BODIES = st.one_of(
    st.binary(max_size=2000),  # garbage, invalid UTF-8 included
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),  # valid JSON of any shape
    st.builds(deep, st.integers(1, 100_000), st.sampled_from(["list", "dict"])),
    st.integers(300, 20_000).map(lambda n: b'{"text": "x", "n": 1' + b"0" * n + b"}"),
    st.sampled_from([b'{"text": 1e999}', b'{"text": "a", "scale": -1e400}', b"NaN", b"[NaN]"]),
    st.integers(1, 3_000_000).map(lambda n: b'{"text": "' + b"a" * n + b'"}'),
    st.text(max_size=20).map(lambda t: f'{{"text": "a", "text": {json.dumps(t)}}}'.encode()),
    st.binary(min_size=1, max_size=20).map(lambda b: b'{"text": "' + b + b'"}'),
    st.just(b'{"text": "\\ud800"}'),  # a lone surrogate
    st.just(b""),
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "",
        "application/json; charset=utf-16",
    ]
)
PATHS = st.sampled_from(
    [
        "/predict",
        "/predict/",
        "//predict",
        "/predict/../metrics",
        "/%2e%2e/predict",
        "/predict%00",
        "/predict?x=%ff",
        "/PREDICT",
        "/predict;a=b",
        "/jobs",
        "/jobs/..%2f..%2fetc%2fpasswd",
        "/jobs/" + "a" * 5000,
        "/jobs/%ff%fe",
        "/docs/../../etc/passwd",
        "/docs/%2e%2e%2fsettings.py",
        "/" + "x" * 6000,
    ]
)
METHODS = st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS"])


def raw_request(
    server: Server, method: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, str, bytes]:
    host, port = server.bind.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        # Refused before the body was all sent (a 413): its answer is still there.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


@FUZZ_SETTINGS
@given(method=METHODS, path=PATHS, body=HOSTILE_BODIES, content_type=CONTENT_TYPES)
def test_hostile_requests_get_a_json_4xx_or_an_answer_never_a_5xx(
    server: Server, method: str, path: str, body: bytes, content_type: str
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    status, got_type, answer = raw_request(server, method, path, body, headers)
    assert_clean(status, got_type, answer, (method, path, body[:200], content_type))


@FUZZ_SETTINGS
@given(
    name=st.sampled_from(
        ["X-Request-ID", "X-Request-Timeout", "Idempotency-Key", "X-Request-Start"]
    ),
    value=st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300)
    | st.sampled_from(
        ["-1", "0", "nan", "inf", "1e999", "99999999999999999999", "0x10", "t=1", "t=1e30"]
    ),
)
def test_hostile_header_values_never_give_a_5xx(server: Server, name: str, value: str) -> None:
    path = "/jobs" if name == "Idempotency-Key" else "/predict"
    headers = {"Content-Type": "application/json", name: value}
    status, got_type, answer = raw_request(server, "POST", path, b'{"text": "x"}', headers)
    own_deadline = name == "X-Request-Timeout"
    assert_clean(status, got_type, answer, (name, value), own_deadline=own_deadline)


def test_the_fuzzed_server_still_answers_normally(server: Server) -> None:
    """Runs last in this module: after everything above, a plain request still works."""
    response = requests.post(server.url + "/predict", json={"text": "after"}, timeout=TIMEOUT_S)
    assert response.status_code == 200
    assert response.json() == {"length": 5, "keys": ["text"], "tags": 0}
