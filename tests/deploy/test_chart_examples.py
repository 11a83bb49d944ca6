"""Every set of values the chart must take (its defaults and each example) lints
strictly and renders manifests valid for the oldest and newest Kubernetes we
support; the examples cover what users start from."""

from __future__ import annotations

import copy
import re
from typing import Any

import helm_python as helm
import pytest

from tests.deploy.chart import (
    EXAMPLES,
    KUBE_VERSIONS,
    VALUE_SETS,
    containers,
    find,
    lint_errors,
    render,
    validate,
)


def set_values(values: Any, prefix: str = "") -> list[str]:
    """The values a file sets: its leaves, with `resources` (one Kubernetes object) as one."""
    if not isinstance(values, dict) or prefix == "resources":
        return [prefix]
    return [
        leaf
        for key, value in values.items()
        for leaf in set_values(value, f"{prefix}.{key}".lstrip("."))
    ]


# --- every value set lints, renders and validates ----------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_chart_lints_strictly(values_name: str, kube_version: str) -> None:
    assert lint_errors(VALUE_SETS[values_name], kube_version) == []


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_manifest_is_valid_kubernetes(
    chart: helm.Chart, values_name: str, kube_version: str
) -> None:
    docs = render(chart, VALUE_SETS[values_name])
    assert {"Deployment", "Service", "Pod"} <= {d["kind"] for d in docs}
    validate(docs, kube_version)


def test_examples_cover_default_custom_handler_gpu_and_everything() -> None:
    assert {p.stem for p in EXAMPLES} >= {
        "values-default",
        "values-custom-handler",
        "values-gpu",
        "values-full",
        "values-batch",
        "values-cache-redis",
        "values-worker",
    }


def test_full_example_switches_on_every_optional_resource(chart: helm.Chart) -> None:
    kinds = {d["kind"] for d in render(chart, VALUE_SETS["values-full"])}
    assert kinds >= {
        "Deployment",
        "Service",
        "Ingress",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ServiceAccount",
        "ServiceMonitor",
        "NetworkPolicy",
        "Pod",
    }


# --- your own image: a handful of values, the tags CI pushes --------------------


def test_custom_handler_example_sets_three_values_or_fewer() -> None:
    values = VALUE_SETS["values-custom-handler"]
    assert set_values(values) == ["image.repository", "image.tag", "resources"]


def test_custom_handler_example_runs_the_users_image_and_its_own_handler(
    chart: helm.Chart,
) -> None:
    values = VALUE_SETS["values-custom-handler"]
    deployment = find(render(chart, values), "Deployment")
    by_name = containers(deployment)
    assert by_name["app"]["image"] == f"ghcr.io/acme/sentiment:{values['image']['tag']}"
    assert by_name["nginx"]["image"] == f"ghcr.io/acme/sentiment-nginx:{values['image']['tag']}"
    assert by_name["app"]["command"] == ["serving-core", "serve"]
    # The image's SERVING_HANDLER (from its HANDLER_DIR build argument) runs.
    assert "SERVING_HANDLER" not in {e["name"] for e in by_name["app"]["env"]}
    assert by_name["app"]["resources"] == values["resources"]


def test_examples_use_tags_image_yml_pushes() -> None:
    # image.yml: sha-<full sha>, 1.2.3 / 1.2 for v1.2.3, <branch>, latest; the
    # CUDA variant adds -cu128 to the release version.
    pushed = re.compile(r"^(sha-[0-9a-f]{40}|\d+\.\d+\.\d+(-cu128)?)$")
    for name, values in VALUE_SETS.items():
        tags = [values["image"]["tag"], values.get("nginx", {}).get("image", {}).get("tag")]
        for tag in filter(None, tags):
            assert pushed.match(tag), f"{name}: {tag}"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda v: v["image"].update(tag=123),
            "at '/image/tag': got number, want string",
        ),
        (lambda v: v.update(replicas=3), "additional properties 'replicas' not allowed"),
    ],
    ids=["wrong-type", "unknown-key"],
)
def test_an_example_with_a_wrong_type_or_unknown_key_fails_the_example_checks(
    change: Any, message: str
) -> None:
    values = copy.deepcopy(VALUE_SETS["values-custom-handler"])
    change(values)
    # The same check test_chart_lints_strictly applies to every example.
    errors = lint_errors(values)
    assert any(message in error for error in errors), errors
