"""A pipeline service: stage URLs from values, and egress to its stages only."""

from __future__ import annotations

import copy
import urllib.parse
from typing import Any

import helm_python as helm
import pytest

from serving_core.pipeline.config import read as read_pipeline
from serving_core.settings import PREFIX
from tests.deploy.chart import (
    KUBE_VERSIONS,
    ROOT,
    VALUE_SETS,
    containers,
    env_of,
    find,
    render,
    serving_core_containers,
    tagged,
    validate,
    with_worker,
)

# --- a pipeline service: stage URLs from values, egress to its stages -------------

STAGES = {"PREP_URL": "http://prep-serving-core", "PRED_URL": "http://pred.models.svc:8000"}
# The iris example as four releases: the pipeline and the classifiers it calls.
IRIS_PIPELINE = ROOT / "handlers" / "iris-pipeline" / "pipeline.yaml"
IRIS_CLASSIFIERS = ["iris-setosa", "iris-versicolor", "iris-virginica"]
DNS = {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}


def server_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "NetworkPolicy")["spec"]  # type: ignore[no-any-return]


def test_stage_urls_reach_every_container_that_runs_the_handler(chart: helm.Chart) -> None:
    values = with_worker(
        {
            "pipeline": {"stageUrls": STAGES},
            "batch": {"enabled": True, "args": ["--input", "in.jsonl", "--output", "out.jsonl"]},
            "extraEnv": [{"name": "OTHER", "value": "x"}],
        }
    )
    runs_serving_core = serving_core_containers(render(chart, values))
    assert {c["name"] for c in runs_serving_core} == {"app", "worker", "batch"}
    for container in runs_serving_core:
        names = [e["name"] for e in container["env"]]
        assert {k: v for k, v in env_of(container).items() if k in STAGES} == STAGES
        # Sorted, after the chart's own variables and before extraEnv.
        assert names[-3:] == ["PRED_URL", "PREP_URL", "OTHER"]


def test_without_stages_no_stage_variable_and_egress_stays_open(chart: helm.Chart) -> None:
    docs = render(chart, tagged({"networkPolicy": {"enabled": True}}))
    policy = server_policy(docs)
    assert policy["policyTypes"] == ["Ingress"]
    assert "egress" not in policy
    assert not [n for n in env_of(containers(find(docs, "Deployment"))["app"]) if "URL" in n]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_a_pipelines_policy_lets_its_pods_reach_dns_and_the_stages_only(
    chart: helm.Chart, kube_version: str
) -> None:
    values = tagged({"pipeline": {"stageUrls": STAGES}, "networkPolicy": {"enabled": True}})
    docs = render(chart, values)
    validate(docs, kube_version)
    policy = server_policy(docs)
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    dns, stages = policy["egress"]
    assert dns == DNS
    # A stage deployed by this chart: its server pods, on their nginx port.
    assert stages["ports"] == [{"port": "http", "protocol": "TCP"}]
    (peer,) = stages["to"]
    assert peer == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/part-of": "serving-core",
                "app.kubernetes.io/component": "server",
            }
        }
    }
    # Ingress is as without stages.
    assert policy["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_egress_rules_from_values_are_added_and_limit_egress_by_themselves(
    chart: helm.Chart, kube_version: str
) -> None:
    redis = {
        "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "redis"}}}],
        "ports": [{"port": 6379, "protocol": "TCP"}],
    }
    with_stages = tagged(
        {
            "pipeline": {"stageUrls": STAGES},
            "serving": {"cacheUrl": "redis://redis.redis.svc:6379/0"},
            "networkPolicy": {"enabled": True, "egress": [redis]},
        }
    )
    docs = render(chart, with_stages)
    validate(docs, kube_version)
    assert server_policy(docs)["egress"][2:] == [redis]
    # No stages: DNS and the rules given, nothing for stages.
    docs = render(chart, tagged({"networkPolicy": {"enabled": True, "egress": [redis]}}))
    validate(docs, kube_version)
    assert server_policy(docs)["policyTypes"] == ["Ingress", "Egress"]
    assert server_policy(docs)["egress"] == [DNS, redis]


def test_stage_urls_without_a_network_policy_render_no_policy(chart: helm.Chart) -> None:
    docs = render(chart, tagged({"pipeline": {"stageUrls": STAGES}}))
    assert "NetworkPolicy" not in {d["kind"] for d in docs}


def iris_releases(chart: helm.Chart) -> dict[str, list[dict[str, Any]]]:
    """The four releases the iris examples describe, by release name."""
    releases = {"iris": render(chart, VALUE_SETS["values-iris-pipeline"], name="iris")}
    for name in IRIS_CLASSIFIERS:
        values = copy.deepcopy(VALUE_SETS["values-iris-classifier"])
        values["image"]["repository"] = f"ghcr.io/your-org/{name}"
        releases[name] = render(chart, values, name=name)
    return releases


@pytest.mark.example("iris-pipeline")
def test_the_iris_pipeline_example_sets_every_stage_url_its_pipeline_file_names(
    chart: helm.Chart,
) -> None:
    app = containers(find(render(chart, VALUE_SETS["values-iris-pipeline"]), "Deployment"))["app"]
    spec = read_pipeline(IRIS_PIPELINE, env_of(app))
    assert spec.unset() == []
    stage_vars = {n for n in env_of(app) if not n.startswith(PREFIX)}
    assert stage_vars == {stage.url_env for stage in spec.stages}


@pytest.mark.example("iris-pipeline", "iris-setosa", "iris-versicolor", "iris-virginica")
def test_the_iris_pipelines_stages_are_the_classifier_releases_services(
    chart: helm.Chart,
) -> None:
    releases = iris_releases(chart)
    app = containers(find(releases["iris"], "Deployment"))["app"]
    spec = read_pipeline(IRIS_PIPELINE, env_of(app))
    services = {
        (doc["metadata"]["name"], port["port"]): name
        for name, docs in releases.items()
        for doc in docs
        if doc["kind"] == "Service"
        for port in doc["spec"]["ports"]
        if port["name"] == "http"
    }
    called = []
    for stage in spec.stages:
        url = urllib.parse.urlsplit(stage.endpoint)
        called.append(services[(url.hostname, url.port or 80)])
    assert sorted(called) == IRIS_CLASSIFIERS
    assert {stage.name for stage in spec.stages} == {"setosa", "versicolor", "virginica"}


def test_the_iris_policies_let_the_pipeline_and_only_it_call_the_classifiers(
    chart: helm.Chart,
) -> None:
    releases = iris_releases(chart)
    pipeline_pod = find(releases["iris"], "Deployment")["spec"]["template"]
    (stages,) = [rule for rule in server_policy(releases["iris"])["egress"] if "to" in rule]
    (peer,) = stages["to"]
    for name in IRIS_CLASSIFIERS:
        pod = find(releases[name], "Deployment")["spec"]["template"]
        # The pipeline may leave towards the classifier's nginx port ...
        assert peer["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["port"] for p in stages["ports"]} <= ports
        # ... and the classifier lets the pipeline's pods in (and helm test's).
        api = server_policy(releases[name])["ingress"][0]
        selectors = [p["podSelector"]["matchLabels"] for p in api["from"]]
        assert any(s.items() <= pipeline_pod["metadata"]["labels"].items() for s in selectors)
        assert server_policy(releases[name])["policyTypes"] == ["Ingress"]
