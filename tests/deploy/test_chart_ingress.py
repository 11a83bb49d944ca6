"""The Ingress: the named controller's annotations for long requests and event
streams, its read timeout derived from the app's deadlines, the user's annotations
over the chart's, and the values it refuses."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    KUBE_VERSIONS,
    ROOT,
    find,
    lint_errors,
    render,
    tagged,
    validate,
)

# What each controller gets with the chart's defaults: a read timeout of
# max(serving.requestTimeoutSeconds 10, serving.generationTimeoutSeconds 300) + 10,
# no response buffering where the controller buffers, and serving.maxBodyBytes where
# it limits bodies (1m in both nginx controllers).
CONTROLLER_ANNOTATIONS: dict[str, dict[str, str]] = {
    "ingress-nginx": {
        "nginx.ingress.kubernetes.io/proxy-read-timeout": "310",
        "nginx.ingress.kubernetes.io/proxy-send-timeout": "310",
        "nginx.ingress.kubernetes.io/proxy-buffering": "off",
        "nginx.ingress.kubernetes.io/proxy-body-size": "1048576",
    },
    "f5-nginx": {
        "nginx.org/proxy-read-timeout": "310s",
        "nginx.org/proxy-send-timeout": "310s",
        "nginx.org/proxy-buffering": "False",
        "nginx.org/client-max-body-size": "1048576",
    },
    "haproxy": {"haproxy.org/timeout-server": "310s"},
    "haproxy-ingress": {"haproxy-ingress.github.io/timeout-server": "310s"},
    "contour": {"projectcontour.io/response-timeout": "310s"},
}
# The annotation that carries each controller's read timeout.
READ_TIMEOUT = {
    "ingress-nginx": "nginx.ingress.kubernetes.io/proxy-read-timeout",
    "f5-nginx": "nginx.org/proxy-read-timeout",
    "haproxy": "haproxy.org/timeout-server",
    "haproxy-ingress": "haproxy-ingress.github.io/timeout-server",
    "contour": "projectcontour.io/response-timeout",
}


def ingress_values(**ingress: Any) -> dict[str, Any]:
    return tagged({"ingress": {"enabled": True, **ingress}})


def annotations(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    ingress = find(render(chart, values), "Ingress")
    return ingress["metadata"].get("annotations", {})  # type: ignore[no-any-return]


def seconds(value: str) -> int:
    return int(value.removesuffix("s"))


@pytest.mark.parametrize("controller", CONTROLLER_ANNOTATIONS)
def test_the_named_controller_gets_its_own_annotations_and_no_other(
    chart: helm.Chart, controller: str
) -> None:
    values = ingress_values(controller=controller)
    assert annotations(chart, values) == CONTROLLER_ANNOTATIONS[controller]


def test_without_a_controller_the_ingress_carries_only_the_users_annotations(
    chart: helm.Chart,
) -> None:
    assert annotations(chart, ingress_values()) == {}
    user = {"cert-manager.io/cluster-issuer": "letsencrypt"}
    assert annotations(chart, ingress_values(annotations=user)) == user


@pytest.mark.parametrize(
    ("serving", "read_timeout_s"),
    [
        ({}, 310),
        ({"generationTimeoutSeconds": 30}, 40),
        # A deadline longer than any generation.
        ({"requestTimeoutSeconds": 600, "generationTimeoutSeconds": 60}, 610),
        # Fractions round up: the controller takes whole seconds.
        ({"requestTimeoutSeconds": 0.2, "generationTimeoutSeconds": 0.5}, 11),
    ],
)
@pytest.mark.parametrize("controller", CONTROLLER_ANNOTATIONS)
def test_the_read_timeout_follows_the_apps_longest_answer(
    chart: helm.Chart, controller: str, serving: dict[str, Any], read_timeout_s: int
) -> None:
    values = ingress_values(controller=controller)
    values["serving"] = serving
    assert seconds(annotations(chart, values)[READ_TIMEOUT[controller]]) == read_timeout_s


@pytest.mark.parametrize("controller", CONTROLLER_ANNOTATIONS)
def test_an_explicit_read_timeout_is_used_as_it_is(chart: helm.Chart, controller: str) -> None:
    values = ingress_values(controller=controller, readTimeoutSeconds=3600)
    rendered = annotations(chart, values)
    assert seconds(rendered[READ_TIMEOUT[controller]]) == 3600
    # The nginx controllers' send timeout goes with it.
    sends = [value for key, value in rendered.items() if key.endswith("proxy-send-timeout")]
    assert [seconds(value) for value in sends] == [3600] * len(sends)


def test_the_nginx_controllers_body_limit_follows_serving_max_body_bytes(
    chart: helm.Chart,
) -> None:
    for controller, key in [
        ("ingress-nginx", "nginx.ingress.kubernetes.io/proxy-body-size"),
        ("f5-nginx", "nginx.org/client-max-body-size"),
    ]:
        values = ingress_values(controller=controller)
        values["serving"] = {"maxBodyBytes": 8388608}
        assert annotations(chart, values)[key] == "8388608"


@pytest.mark.parametrize("controller", CONTROLLER_ANNOTATIONS)
def test_the_users_annotations_win_over_the_controllers(chart: helm.Chart, controller: str) -> None:
    mine = dict.fromkeys(CONTROLLER_ANNOTATIONS[controller], "mine")
    mine["cert-manager.io/cluster-issuer"] = "letsencrypt"
    values = ingress_values(controller=controller, annotations=mine)
    assert annotations(chart, values) == mine
    # One of them only: the chart still sets the rest.
    first = next(iter(CONTROLLER_ANNOTATIONS[controller]))
    values = ingress_values(controller=controller, annotations={first: "mine"})
    assert annotations(chart, values) == {
        **CONTROLLER_ANNOTATIONS[controller],
        first: "mine",
    }


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("controller", ["", *CONTROLLER_ANNOTATIONS])
def test_each_controllers_ingress_is_valid_and_lints_clean(
    chart: helm.Chart, controller: str, kube_version: str
) -> None:
    values = ingress_values(
        controller=controller,
        annotations={"cert-manager.io/cluster-issuer": "letsencrypt"},
        tls=[{"secretName": "tls", "hosts": ["serving.example.com"]}],
    )
    validate(render(chart, values), kube_version)
    assert lint_errors(values, kube_version) == []


REFUSALS = [
    (
        {"controller": "contour", "readTimeoutSeconds": 60},
        "ingress.readTimeoutSeconds (60) is shorter than the longest the app works on a "
        "request, max(serving.requestTimeoutSeconds, serving.generationTimeoutSeconds) = 300 s",
    ),
    (
        {"readTimeoutSeconds": 600},
        "ingress.readTimeoutSeconds (600) is set but ingress.controller is empty",
    ),
]


@pytest.mark.parametrize(("ingress", "message"), REFUSALS)
def test_the_chart_refuses_a_read_timeout_that_would_cut_answers_or_go_nowhere(
    chart: helm.Chart, ingress: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError) as refused:
        render(chart, ingress_values(**ingress))
    assert message in str(refused.value)


def test_a_read_timeout_as_long_as_the_longest_answer_is_taken(chart: helm.Chart) -> None:
    values = ingress_values(controller="haproxy", readTimeoutSeconds=300)
    assert annotations(chart, values) == {"haproxy.org/timeout-server": "300s"}


def test_a_disabled_ingress_checks_none_of_its_values(chart: helm.Chart) -> None:
    values = tagged({"ingress": {"enabled": False, "readTimeoutSeconds": 1}})
    assert [d for d in render(chart, values) if d["kind"] == "Ingress"] == []


BAD_VALUES = [
    ({"controller": "nginx"}, "at '/ingress/controller'"),
    ({"controller": "traefik"}, "at '/ingress/controller'"),
    ({"readTimeoutSeconds": -1}, "at '/ingress/readTimeoutSeconds'"),
    ({"readTimeoutSeconds": "310s"}, "at '/ingress/readTimeoutSeconds': got string, want integer"),
    ({"readTimeoutSeconds": 310.5}, "at '/ingress/readTimeoutSeconds'"),
    ({"readTimeout": 310}, "at '/ingress': additional properties 'readTimeout' not allowed"),
    ({"annotations": {"haproxy.org/timeout-server": 310}}, "at '/ingress/annotations/"),
]


@pytest.mark.parametrize(("ingress", "message"), BAD_VALUES)
def test_the_schema_refuses_bad_ingress_values_naming_the_key(
    chart: helm.Chart, ingress: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(ingress_values(**ingress), name="demo", namespace="serving")
    assert message in str(refused.value)


# --- documentation ---------------------------------------------------------------


def test_the_readme_names_every_controller_and_annotation_the_chart_sets() -> None:
    readme = (CHART / "README.md").read_text()
    missing = [
        name
        for controller, keys in CONTROLLER_ANNOTATIONS.items()
        for name in [f"`{controller}`", *(f"`{key}`" for key in keys)]
        if name not in readme
    ]
    assert missing == [], f"README.md does not mention {missing}"


def test_the_deployment_guide_names_every_controller() -> None:
    guide = (ROOT / "docs" / "deployment" / "kubernetes.md").read_text()
    assert [c for c in CONTROLLER_ANNOTATIONS if f"`{c}`" not in guide] == []


def test_the_deployment_guides_ingress_example_sets_its_controllers_timeout(
    chart: helm.Chart,
) -> None:
    guide = (ROOT / "docs" / "deployment" / "kubernetes.md").read_text()
    section = guide.split("### Ingress, Gateway and long answers", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "kubernetes.md lost its Ingress example"
    values = tagged(yaml.safe_load(block.group(1)))
    controller = values["ingress"]["controller"]
    assert annotations(chart, values) == CONTROLLER_ANNOTATIONS[controller]
