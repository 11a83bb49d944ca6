"""Traces in compose: the profile `tracing` adds Jaeger beside the stack, and
compose.tracing.yml, laid over docker-compose.yml, turns on the traces of every
service that runs a handler, pointed at Jaeger's OTLP/HTTP port. Checked without
an engine (compose's schema: tests/deploy/test_workflows.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from serving_core.settings import Settings
from tests.container.test_dockerfiles import compose
from tests.servers import ROOT


def tracing() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "compose.tracing.yml").read_text())
    return loaded


def runs_a_handler(spec: dict[str, Any]) -> bool:
    """A service built from the app's Dockerfile (nginx's image is built from nginx/)."""
    return spec.get("build", {}).get("context") == "."


def jaeger_otlp_port() -> str:
    (otlp,) = [p for p in compose()["services"]["jaeger"]["ports"] if p.endswith(":4318")]
    return otlp.rpartition(":")[2]


def test_the_tracing_profile_is_jaeger_alone_and_the_default_stack_is_as_it_was() -> None:
    services = compose()["services"]
    profiled = {name for name, spec in services.items() if spec.get("profiles") == ["tracing"]}
    assert profiled == {"jaeger"}
    for name, spec in services.items():
        assert "jaeger" not in spec.get("depends_on", {}), name
        assert not any(k.startswith("OTEL_") for k in spec.get("environment", {})), name
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", services["jaeger"]["image"])


def test_jaegers_ui_and_otlp_port_are_published_on_localhost_only() -> None:
    jaeger = compose()["services"]["jaeger"]
    assert sorted(jaeger["ports"]) == ["127.0.0.1:16686:16686", "127.0.0.1:4318:4318"]
    # Reachable by the services on the internal network, and able to publish.
    networks = compose()["networks"]
    assert "backend" in jaeger["networks"]
    assert any(not networks[n].get("internal") for n in jaeger["networks"])


def test_the_override_traces_every_service_that_runs_a_handler_and_no_other() -> None:
    built = {name for name, spec in compose()["services"].items() if runs_a_handler(spec)}
    assert set(tracing()["services"]) == built


@pytest.mark.parametrize("service", sorted(tracing()["services"]))
def test_each_traced_service_sends_otlp_to_jaeger_and_still_starts(service: str) -> None:
    override = tracing()["services"][service]
    environment = override["environment"]
    assert environment["SERVING_TRACES"] == "otlp"
    assert environment["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://jaeger:{jaeger_otlp_port()}"
    assert environment["OTEL_SERVICE_NAME"]
    # Compose merges the two files' variables; serving-core refuses an unknown SERVING_*
    # name at start-up, so the merged ones must all be settings it takes.
    merged = {**compose()["services"][service]["environment"], **environment}
    serving = {k: str(v) for k, v in merged.items() if k.startswith("SERVING_")}
    assert Settings.from_env(serving, cores=2).traces == "otlp"
    # Up without the profile's Jaeger too: it then drops its spans.
    assert override["depends_on"]["jaeger"] == {
        "condition": "service_started",
        "required": False,
    }


def test_the_sampler_comes_from_the_shell_with_every_trace_by_default() -> None:
    for spec in tracing()["services"].values():
        environment = spec["environment"]
        assert environment["OTEL_TRACES_SAMPLER"] == "${OTEL_TRACES_SAMPLER:-parentbased_always_on}"
        # A name without a value: passed from the shell only when set there.
        assert environment["OTEL_TRACES_SAMPLER_ARG"] is None


def test_a_pipelines_stages_are_services_of_their_own() -> None:
    services = tracing()["services"]
    names = {name: services[name]["environment"]["OTEL_SERVICE_NAME"] for name in services}
    stages = {n for n in names if n.startswith("iris-")}
    assert {names[n] for n in stages} == stages
    assert {names[n] for n in set(names) - stages} == {"serving-core"}
