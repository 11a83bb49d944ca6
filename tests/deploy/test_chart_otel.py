"""Traces (otel.*): off by default, nothing set; on, every container that runs the
handler (server, worker, stream, batch) gets SERVING_TRACES=otlp and OpenTelemetry's
OTEL_* variables, whose resource attributes the SDK itself reads back as the release,
namespace, pod, container and model revision. The OTLP headers come from a Secret
only; bad combinations are refused."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
from opentelemetry.sdk.resources import OTELResourceDetector

from serving_core.settings import Settings
from tests.deploy.chart import (
    KUBE_VERSIONS,
    VALUE_SETS,
    lint_errors,
    pod_specs,
    render,
    serving_core_containers,
    serving_env,
    tagged,
    validate,
)
from tests.deploy.test_chart_model import EVERY_POD, LOADERS

ENDPOINT = "http://otel-collector.observability:4318"
OTEL: dict[str, Any] = {"enabled": True, "endpoint": ENDPOINT}
# What the downward API gives the sample pod (the kubelet fills in $(K8S_*)).
POD = {"K8S_POD_NAME": "demo-serving-core-7d9f-abcde", "K8S_NAMESPACE_NAME": "serving"}


def with_otel(otel: dict[str, Any] | None = None, **more: Any) -> dict[str, Any]:
    values = tagged({**EVERY_POD, "otel": {**OTEL, **(otel or {})}, **more})
    values["serving"] = {**EVERY_POD["serving"], **more.get("serving", {})}
    return values


def loaders(chart: helm.Chart, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The container that runs the handler in each of the four kinds of pod, by name."""
    found = {c["name"]: c for spec in pod_specs(render(chart, values)) for c in spec["containers"]}
    assert set(found) >= LOADERS
    return {name: found[name] for name in LOADERS}


def env_entries(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def expanded(env: dict[str, dict[str, Any]], name: str) -> str:
    """The variable's value as the kubelet sets it: $(VAR) of an earlier variable filled in."""
    names = list(env)
    value: str = env[name]["value"]

    def fill(match: re.Match[str]) -> str:
        referenced = match.group(1)
        assert names.index(referenced) < names.index(name), f"{referenced} comes after {name}"
        return POD[referenced]

    return re.sub(r"\$\(([A-Z0-9_]+)\)", fill, value)


def resource_of(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The resource attributes OpenTelemetry's SDK reads from the container's variables."""
    env = env_entries(container)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", expanded(env, "OTEL_RESOURCE_ATTRIBUTES"))
    monkeypatch.setenv("OTEL_SERVICE_NAME", env["OTEL_SERVICE_NAME"]["value"])
    return dict(OTELResourceDetector().detect().attributes)


# --- off by default ------------------------------------------------------------


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_traces_are_off_by_default_no_otel_variable_anywhere(
    chart: helm.Chart, values_name: str
) -> None:
    if VALUE_SETS[values_name].get("otel", {}).get("enabled"):
        pytest.skip("this example turns traces on")
    for container in serving_core_containers(render(chart, VALUE_SETS[values_name])):
        names = {e["name"] for e in container.get("env", [])}
        assert not {n for n in names if n.startswith(("OTEL_", "K8S_"))}, container["name"]
        assert "SERVING_TRACES" not in names
        assert Settings.from_env(serving_env(container), cores=2).traces == "off"


def test_otel_values_without_enabled_change_nothing(chart: helm.Chart) -> None:
    off = {**OTEL, "enabled": False, "headersSecret": {"name": "otlp"}, "environment": "prod"}
    assert render(chart, with_otel(off)) == render(chart, with_otel({"enabled": False}))


# --- on: every container that runs the handler --------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_container_that_runs_the_handler_exports_traces(
    chart: helm.Chart, kube_version: str
) -> None:
    values = with_otel({"sampler": "parentbased_traceidratio", "samplerArg": "0.1"})
    validate(render(chart, values), kube_version)
    for name, container in loaders(chart, values).items():
        env = env_entries(container)
        plain = {k: e["value"] for k, e in env.items() if "value" in e}
        assert plain["SERVING_TRACES"] == "otlp", name
        assert plain["OTEL_EXPORTER_OTLP_ENDPOINT"] == ENDPOINT
        assert plain["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
        assert plain["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
        assert plain["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
        assert plain["OTEL_SERVICE_NAME"] == "demo-serving-core"
        assert env["K8S_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["K8S_NAMESPACE_NAME"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.namespace"}
        }
        assert "OTEL_EXPORTER_OTLP_HEADERS" not in env
        assert Settings.from_env(serving_env(container), cores=2).traces == "otlp"


def test_each_span_names_its_release_pod_container_and_model_revision(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = with_otel({"environment": "production"}, serving={"modelRevision": "sha256:0a1b"})
    for name, container in loaders(chart, values).items():
        resource = resource_of(container, monkeypatch)
        assert resource == {
            "service.name": "demo-serving-core",
            "helm.release": "demo",
            "k8s.namespace.name": "serving",
            "k8s.pod.name": POD["K8S_POD_NAME"],
            "k8s.container.name": name,
            # The pods' serving-core.io/model-revision label, as the dashboard has it.
            "serving.model.revision": "sha256-0a1b",
            "deployment.environment.name": "production",
            "deployment.environment": "production",
        }


def test_the_revision_attribute_is_the_pods_revision_label(chart: helm.Chart) -> None:
    docs = render(chart, with_otel(serving={"modelRevision": "minilm/2026-11-30"}))
    for doc in docs:
        template = doc.get("spec", {}).get("template") or doc.get("spec", {}).get(
            "jobTemplate", {}
        ).get("spec", {}).get("template")
        if not template:
            continue
        label = template["metadata"]["labels"].get("serving-core.io/model-revision")
        for container in template["spec"]["containers"]:
            if container["name"] in LOADERS:
                attributes = env_entries(container)["OTEL_RESOURCE_ATTRIBUTES"]["value"]
                assert f"serving.model.revision={label}" in attributes.split(",")
                assert label == "minilm-2026-11-30"


def test_resource_attributes_are_encoded_as_the_sdk_decodes_them_and_override_the_charts(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    attributes = {"team": "search, ranking=2", "k8s.cluster.name": "eu west", "helm.release": "x"}
    values = with_otel({"resourceAttributes": attributes, "serviceName": "minilm"})
    for container in loaders(chart, values).values():
        resource = resource_of(container, monkeypatch)
        assert resource["service.name"] == "minilm"
        assert resource["team"] == "search, ranking=2"
        assert resource["k8s.cluster.name"] == "eu west"
        assert resource["helm.release"] == "x"  # the user's, over the chart's


def test_the_otlp_headers_come_only_from_their_secret(chart: helm.Chart) -> None:
    values = with_otel({"headersSecret": {"name": "otlp-backend", "key": "api-headers"}})
    for container in loaders(chart, values).values():
        (headers,) = [e for e in container["env"] if e["name"] == "OTEL_EXPORTER_OTLP_HEADERS"]
        assert headers == {
            "name": "OTEL_EXPORTER_OTLP_HEADERS",
            "valueFrom": {"secretKeyRef": {"name": "otlp-backend", "key": "api-headers"}},
        }
    # No value the chart takes can carry them in plain text.
    refused = with_otel({"headers": "api-key=secret"})
    with pytest.raises(helm.HelmValuesError, match="additional properties 'headers' not allowed"):
        render(chart, refused)


def test_otel_extra_env_reaches_every_container_that_runs_the_handler(chart: helm.Chart) -> None:
    extra = [{"name": "OTEL_BSP_MAX_QUEUE_SIZE", "value": "4096"}]
    for container in loaders(chart, with_otel({"extraEnv": extra})).values():
        assert env_entries(container)["OTEL_BSP_MAX_QUEUE_SIZE"]["value"] == "4096"


def test_nginx_and_the_init_container_get_no_otel_variables(chart: helm.Chart) -> None:
    values = with_otel(model={"uri": "s3://models/minilm/"})
    for spec in pod_specs(render(chart, values)):
        for container in spec["containers"] + spec.get("initContainers", []):
            if container["name"] not in LOADERS:
                names = {e["name"] for e in container.get("env", [])}
                assert not {n for n in names if n.startswith("OTEL_")}, container["name"]


def test_the_otel_example_lints_and_turns_traces_on(chart: helm.Chart) -> None:
    values = VALUE_SETS["values-otel"]
    assert lint_errors(values) == []
    (app,) = [c for c in serving_core_containers(render(chart, values)) if c["name"] == "app"]
    env = env_entries(app)
    assert env["SERVING_TRACES"]["value"] == "otlp"
    assert "secretKeyRef" in env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]


# --- refusals -----------------------------------------------------------------

SCHEMA_REFUSALS = [
    ({"otel": {"enable": True}}, "at '/otel': additional properties 'enable' not allowed"),
    ({"otel": {"protocol": "grpc"}}, "at '/otel/protocol'"),
    ({"otel": {"endpoint": "otel-collector:4318"}}, "at '/otel/endpoint'"),
    ({"otel": {"sampler": "ratio"}}, "at '/otel/sampler'"),
    ({"otel": {"samplerArg": "10%"}}, "at '/otel/samplerArg'"),
    ({"otel": {"samplerArg": 0.1}}, "at '/otel/samplerArg': got number, want string"),
    ({"otel": {"resourceAttributes": {"a,b": "c"}}}, "at '/otel/resourceAttributes'"),
    (
        {"otel": {"headersSecret": {"nmae": "otlp"}}},
        "at '/otel/headersSecret': additional properties 'nmae' not allowed",
    ),
]


@pytest.mark.parametrize(("values", "message"), SCHEMA_REFUSALS)
def test_the_schema_refuses_bad_otel_values(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(tagged(values), name="demo", namespace="serving")
    assert message in str(refused.value)
    assert any(message in error for error in lint_errors(tagged(values)))


TEMPLATE_REFUSALS = [
    ({"otel": {"enabled": True}}, "otel.enabled needs otel.endpoint"),
    (
        {"otel": {"samplerArg": "0.1"}},
        "otel.samplerArg (0.1) is the ratio of a traceidratio sampler, but otel.sampler is "
        "parentbased_always_on",
    ),
    (
        {"otel": {"resourceAttributes": {"service.name": "x"}}},
        "otel.resourceAttributes sets service.name",
    ),
    (
        {"extraEnv": [{"name": "SERVING_TRACES", "value": "otlp"}]},
        "extraEnv sets SERVING_TRACES, which the chart sets from otel.enabled",
    ),
    (
        {"otel": OTEL, "extraEnv": [{"name": "OTEL_SERVICE_NAME", "value": "x"}]},
        "extraEnv sets OTEL_SERVICE_NAME, which the chart sets from otel.*",
    ),
    (
        {"otel": {"extraEnv": [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "x"}]}},
        "otel.extraEnv sets OTEL_EXPORTER_OTLP_ENDPOINT",
    ),
    (
        {"otel": {"extraEnv": [{"name": "SERVING_LOG_LEVEL", "value": "debug"}]}},
        "otel.extraEnv sets SERVING_LOG_LEVEL, but SERVING_* names are serving-core's",
    ),
    (
        {
            "otel": OTEL,
            "networkPolicy": {"enabled": True},
            "pipeline": {"stageUrls": {"PREP_URL": "http://prep:8000"}},
        },
        "otel.enabled sends spans to http://otel-collector.observability:4318: add a rule",
    ),
]


@pytest.mark.parametrize(("values", "message"), TEMPLATE_REFUSALS)
def test_bad_otel_combinations_are_refused_saying_what_to_change(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError) as refused:
        chart.render(tagged(values), name="demo", namespace="serving")
    assert message in str(refused.value)


def test_traces_on_lint_strictly() -> None:
    values = with_otel({"headersSecret": {"name": "otlp"}, "resourceAttributes": {"team": "ml"}})
    assert lint_errors(values) == []
