"""The tracer itself: off costs nothing and loads nothing; on, what it hands the SDK."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from serving_core.errors import InvalidParams, ModelError
from serving_core.settings import Settings, SettingsError
from serving_core.tracing import traceparent
from serving_core.tracing.otel import OtelTracer
from serving_core.tracing.tracer import NO_SPAN, Tracer, installed, log_fields, tracer
from tests.test_package import loaded_after

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        (VALID, (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)),
        (VALID.upper(), (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)),
        # A later version's first four fields parse alike, and what follows is ignored.
        ("01" + VALID[2:] + "-later", (0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)),
        (VALID + "-more", None),  # version 00 has exactly four fields
        ("ff" + VALID[2:], None),  # version ff is invalid
        ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", None),  # all-zero trace id
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", None),
        ("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", None),  # short
        ("garbage", None),
        ("", None),
        (None, None),
        ("00-" + "a" * 600, None),
    ],
)
def test_a_traceparent_parses_or_is_ignored(value: str | None, ids: tuple | None) -> None:
    assert traceparent.parse(value) == ids


def test_a_traceparent_is_formed_back_and_read_for_its_parts() -> None:
    assert traceparent.form(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0xF067AA0BA902B7, 1) == VALID
    assert traceparent.trace_id_of(VALID) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert traceparent.sampled(VALID)
    assert not traceparent.sampled(VALID[:-2] + "00")
    assert traceparent.trace_id_of("nonsense") is None


def test_traces_are_off_by_default_and_a_bad_value_names_the_variable() -> None:
    assert Settings.from_env({}).traces == "off"
    assert Settings.from_env({"SERVING_TRACES": "otlp"}).traces == "otlp"
    with pytest.raises(SettingsError, match="SERVING_TRACES='jaeger'"):
        Settings.from_env({"SERVING_TRACES": "jaeger"})


def test_off_every_call_answers_at_once_with_nothing() -> None:
    off = tracer()
    assert not off.enabled
    with off.span("x", parent=VALID, links=[VALID]) as span:
        assert span is NO_SPAN
        assert off.current() is None
    headers: dict[str, str] = {}
    off.inject(headers)
    assert headers == {}
    assert log_fields() == {}


def test_serving_with_traces_off_loads_no_opentelemetry() -> None:
    code = (
        "from serving_core.settings import Settings\n"
        "from serving_core.loading import load_handler\n"
        "from serving_core.process.server import build\n"
        "from serving_core.tracing import setup\n"
        "settings = Settings.from_env({'SERVING_HANDLER': 'tests/handlers/probe'})\n"
        "build(settings, load_handler('tests/handlers/probe'))\n"
        "setup.start(settings.traces, {})\n"
    )
    assert loaded_after(code, ["opentelemetry"]) == []


@pytest.fixture
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with installed(OtelTracer(provider)):
        yield exporter


def test_a_span_is_current_in_its_block_and_its_children_are_under_it(
    spans: InMemorySpanExporter,
) -> None:
    traces = tracer()
    with traces.span("outer", parent=VALID) as outer:
        assert traces.current() == outer.traceparent
        assert log_fields() == {"trace_id": outer.trace_id, "span_id": outer.traceparent[36:52]}
        headers: dict[str, str] = {}
        traces.inject(headers)
        assert headers["traceparent"] == outer.traceparent
        with traces.span("inner"):
            pass
    assert traces.current() is None
    inner, finished = spans.get_finished_spans()
    assert finished.parent.span_id == 0x00F067AA0BA902B7
    assert finished.context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert inner.parent.span_id == finished.context.span_id


def test_a_span_drawn_after_the_fact_keeps_its_monotonic_times(
    spans: InMemorySpanExporter,
) -> None:
    began = time.monotonic() - 0.5
    span = tracer().start("queue", links=[VALID, None, "bad"], at=began)
    span.end(at=began + 0.2)
    (done,) = spans.get_finished_spans()
    assert done.end_time - done.start_time == pytest.approx(0.2e9, abs=2e6)
    assert time.time_ns() - done.start_time == pytest.approx(0.5e9, abs=0.2e9)
    assert [link.context.span_id for link in done.links] == [0x00F067AA0BA902B7]


def test_a_clients_error_leaves_the_status_unset_and_a_servers_sets_it(
    spans: InMemorySpanExporter,
) -> None:
    for error in (InvalidParams("no"), ModelError("broke")):
        with pytest.raises(type(error)), tracer().span(type(error).__name__):
            raise error
    client, server = spans.get_finished_spans()
    assert client.status.status_code.name == "UNSET"
    assert client.attributes["error.type"] == "InvalidParams"
    assert server.status.status_code.name == "ERROR"
    assert [event.name for event in server.events] == ["exception"]


def test_an_answered_status_decides_over_what_the_block_raises(
    spans: InMemorySpanExporter,
) -> None:
    # A gRPC abort raises a plain exception for a 400 too.
    def abort() -> None:
        with tracer().span("call") as span:
            span.answered(400)
            raise RuntimeError("aborted")

    with pytest.raises(RuntimeError):
        abort()
    (done,) = spans.get_finished_spans()
    assert done.status.status_code.name == "UNSET"
    assert done.attributes["http.response.status_code"] == 400


def test_installed_puts_the_previous_tracer_back() -> None:
    before = tracer()
    with installed(Tracer()) as chosen:
        assert tracer() is chosen
    assert tracer() is before


def test_under_a_dropped_span_no_child_is_made_but_the_drop_is_passed_on() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dropped = VALID[:-2] + "00"
    traces = OtelTracer(provider)
    with installed(traces), traces.span("POST /predict", parent=dropped, kind="server") as request:
        assert request.traceparent is not None
        assert request.traceparent.endswith("-00")  # the caller's decision, passed on
        with traces.span("admission") as admission:
            assert admission is NO_SPAN
            assert traces.current() == request.traceparent
        assert traces.start("queue", at=time.monotonic()) is NO_SPAN
    assert exporter.get_finished_spans() == ()


def test_a_batch_of_dropped_requests_makes_no_model_span(spans: InMemorySpanExporter) -> None:
    from serving_core.context import Context
    from serving_core.engine.engine import Engine
    from serving_core.loading import load_handler

    engine = Engine(load_handler("tests/handlers/probe").handler, max_batch_size=4)
    engine.handler.setup()
    dropped = [Context(str(i), traceparent=VALID[:-2] + "00") for i in range(2)]
    ran = engine.run([{"text": "a"}, {"text": "b"}], dropped)
    assert ran.span is None
    assert spans.get_finished_spans() == ()
    kept = [dropped[0], Context("2", traceparent=VALID)]
    ran = engine.run([{"text": "a"}, {"text": "b"}], kept)
    (model,) = spans.get_finished_spans()
    assert ran.span is not None
    assert model.parent.span_id == 0x00F067AA0BA902B7
    assert len(model.links) == 2


def test_console_traces_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from serving_core.tracing import setup

    setup.start("console", {"serving.model.name": "probe"})
    try:
        with tracer().span("seen"):
            pass
    finally:
        setup.stop()  # exports what is queued
    out, err = capsys.readouterr()
    assert '"name": "seen"' in err
    assert out == ""
