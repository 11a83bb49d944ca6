"""Fuzzing a generating handler's server: schemathesis over every operation of its
/openapi.json, the event streams, V2's generate extension and OpenAI's API included.
What must hold is what tests/web/test_fuzz.py holds the one-shot server to."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import HANDLERS
from tests.servers import Server, gunicorn_server
from tests.web.test_fuzz import FUZZ_SETTINGS, call_clean, schema_cases

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
    paths, strategy = schema_cases(server.url)
    assert {"/v1/chat/completions", "/v1/completions"} <= paths, paths
    assert any(path.endswith("/generate_stream") for path in paths), paths
    return strategy


@FUZZ_SETTINGS
@given(data=st.data())
def test_no_operation_of_a_generator_answers_with_a_5xx_or_a_traceback(
    generated_requests: st.SearchStrategy[Any], data: st.DataObject
) -> None:
    call_clean(data.draw(generated_requests))
