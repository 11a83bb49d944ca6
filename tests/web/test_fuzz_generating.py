"""Fuzzing a generating handler's server: schemathesis over every operation of its
/openapi.json, the event streams, V2's generate extension and OpenAI's API included.
What must hold is what tests/web/test_fuzz.py holds the one-shot server to."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import given
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tests.conftest import HANDLERS
from tests.servers import Server, gunicorn_server
from tests.web.test_fuzz import FUZZ_SETTINGS, TIMEOUT_S, assert_clean

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {
        "SERVING_HANDLER": str(HANDLERS / "generating/handler.py"),
        "SERVING_WORKERS": "1",
        "SERVING_JOBS_PATH": str(tmp_path_factory.mktemp("fuzz") / "jobs.db"),
    }
    with gunicorn_server(env) as running:
        yield running
        log = running.output()
    assert "Traceback" not in log, f"the server logged a traceback while fuzzed:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def generated_requests(server: Server) -> st.SearchStrategy[Any]:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/chat/completions", "/v1/completions"} <= paths, paths
    assert any(path.endswith("/generate_stream") for path in paths), paths
    return st.one_of(
        [op.as_strategy(generation_mode=mode) for op in operations for mode in GenerationMode]
    )


@FUZZ_SETTINGS
@given(data=st.data())
def test_no_operation_of_a_generator_answers_with_a_5xx_or_a_traceback(
    generated_requests: st.SearchStrategy[Any], data: st.DataObject
) -> None:
    case = data.draw(generated_requests)
    response = case.call(timeout=TIMEOUT_S)
    assert_clean(
        response.status_code,
        response.headers.get("content-type", [""])[0],
        response.content,
        (case.method, case.formatted_path, case.headers, case.query, case.body),
        own_deadline="X-Request-Timeout" in (case.headers or {}),
        v2=case.formatted_path.startswith("/v2"),
    )
