"""A text generator's request, streamed through the official ``openai`` client, is one
trace: the request's span, its wait to join the running generations, its steps."""

from __future__ import annotations

import openai
import pytest

from tests.generation import ENV
from tests.otlp_receiver import Receiver, tracing_env
from tests.servers import gunicorn_server

pytestmark = pytest.mark.e2e

CLIENT_TRACE = "5bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "10f067aa0ba902b7"


def test_a_streamed_chat_is_one_trace_with_its_generation(otlp: Receiver) -> None:
    with gunicorn_server(tracing_env(otlp, **ENV)) as server:
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        with openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="none", max_retries=0, default_headers=headers
        ) as client:
            stream = client.chat.completions.create(
                model="generating",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                stream=True,
            )
            chunks = [c for c in stream if c.choices and c.choices[0].delta.content]
        spans = otlp.wait_for(
            lambda spans: (
                [s for s in spans if s.trace_id == CLIENT_TRACE and s.name == "generate"]
                and [s for s in spans if s.trace_id == CLIENT_TRACE]
            ),
            "the generation's span",
        )
    names = {s.name: s for s in spans}
    request = names["POST /v1/chat/completions"]
    assert request.parent_id == CLIENT_SPAN
    assert names["queue"].parent_id == request.span_id
    generate = names["generate"]
    assert generate.parent_id == request.span_id
    assert generate.attributes["serving.generation.chunks"] == len(chunks) == 3
    assert generate.attributes["serving.generation.cancelled"] is False
    assert names["queue"].end_ns <= generate.start_ns + 1_000_000
