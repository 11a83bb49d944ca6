"""Scaling and availability: the HorizontalPodAutoscaler and PodDisruptionBudget of
the server, and KEDA's ScaledObject that scales the job worker on its queue's
length."""

from __future__ import annotations

import copy
import re
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from serving_core.jobs.redis.connection import GROUP
from serving_core.jobs.redis.queue import RedisJobQueue
from serving_core.settings import Settings
from tests.deploy.chart import (
    CHART,
    JOBS_SECRET,
    KUBE_VERSIONS,
    QUEUE_URL,
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
    worker_container,
)
from tests.deploy.keda_crd import SCALED_OBJECT

# --- scaling and availability --------------------------------------------------


def test_hpa_targets_the_deployment_on_cpu_and_queue_depth(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-full"])
    hpa = find(docs, "HorizontalPodAutoscaler")
    deployment = find(docs, "Deployment")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 20)
    cpu, pods = hpa["spec"]["metrics"]
    assert cpu["resource"] == {
        "name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": 70},
    }
    assert pods["pods"] == {
        "metric": {"name": "serving_queue_depth"},
        "target": {"type": "AverageValue", "averageValue": "16"},
    }
    # The HPA owns the replica count.
    assert "replicas" not in deployment["spec"]


def test_hpa_is_cpu_only_by_default_when_enabled(chart: helm.Chart) -> None:
    hpa = find(render(chart, tagged({"autoscaling": {"enabled": True}})), "HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]


def test_without_autoscaling_replica_count_applies(chart: helm.Chart) -> None:
    docs = render(chart, tagged({"replicaCount": 4}))
    assert find(docs, "Deployment")["spec"]["replicas"] == 4
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]


def test_disruption_budget_selects_the_server_pods(chart: helm.Chart) -> None:
    docs = render(chart, tagged({}))
    selector = find(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert selector == find(docs, "Deployment")["spec"]["selector"]["matchLabels"]


# --- KEDA: the ScaledObject on the queue's length ----------------------------------


def scaled_object(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "ScaledObject", "worker")


def redis_trigger(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (trigger,) = scaled_object(docs)["spec"]["triggers"]
    assert trigger["type"] == "redis-streams"
    return trigger  # type: ignore[no-any-return]


def test_keda_is_off_by_default(chart: helm.Chart) -> None:
    assert "ScaledObject" not in {d["kind"] for d in render(chart, with_worker())}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_scaled_object_scales_the_worker_on_its_streams_length(
    chart: helm.Chart, kube_version: str
) -> None:
    docs = render(chart, VALUE_SETS["values-worker"])
    validate(docs, kube_version)
    deployment = find(docs, "Deployment", "worker")
    spec = scaled_object(docs)["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
        "envSourceContainerName": worker_container(docs)["name"],
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 20)
    assert (spec["pollingInterval"], spec["cooldownPeriod"]) == (15, 300)
    trigger = redis_trigger(docs)
    assert trigger["metadata"] == {
        "stream": "serving-core:jobs:{all-minilm-l6-v2}:stream",
        "streamLength": "128",
        "activationLagCount": "0",
        "address": "redis-master.queue.svc:6379",
        "passwordFromEnv": "REDIS_PASSWORD",
        "databaseIndex": "0",
        "enableTLS": "false",
    }
    assert "authenticationRef" not in trigger
    # KEDA owns the worker's replica count.
    assert "replicas" not in deployment["spec"]


def test_the_stream_is_the_one_the_redis_queue_writes(chart: helm.Chart) -> None:
    docs = render(chart, with_worker(queue="all-minilm-l6-v2", keda={"enabled": True}))
    settings = Settings.from_env({"SERVING_JOBS_URL": QUEUE_URL}, cores=2)
    queue = RedisJobQueue(settings, "all-minilm-l6-v2")  # connects on first use only
    assert redis_trigger(docs)["metadata"]["stream"] == queue.stream
    # streamLength mode is XLEN, which counts jobs queued and running alike since
    # finished entries are deleted. KEDA reads a consumerGroup (ours is GROUP) as a
    # switch to its pendingEntriesCount mode, which would count the running ones only.
    assert GROUP == "workers"
    assert "consumerGroup" not in redis_trigger(docs)["metadata"]


@pytest.mark.example("minilm")
def test_the_minilm_example_names_the_minilm_handlers_queue() -> None:
    handler = (ROOT / "handlers" / "minilm" / "handler.py").read_text()
    queue = VALUE_SETS["values-worker"]["worker"]["queue"]
    assert re.search(rf'^\s+name = "{re.escape(queue)}"$', handler, re.MULTILINE)


def test_the_keda_password_variable_is_in_the_workers_environment(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-worker"])
    variable = redis_trigger(docs)["metadata"]["passwordFromEnv"]
    (entry,) = [e for e in worker_container(docs)["env"] if e["name"] == variable]
    assert entry["valueFrom"]["secretKeyRef"]["name"] == JOBS_SECRET["name"]


@pytest.mark.parametrize(
    ("url", "address", "database", "tls"),
    [
        ("redis://redis.queue.svc:6380/3", "redis.queue.svc:6380", "3", "false"),
        ("rediss://redis.example.com/1", "redis.example.com:6379", "1", "true"),
        ("redis://redis", "redis:6379", "0", "false"),
    ],
)
def test_keda_takes_the_redis_address_from_a_plain_jobs_url(
    chart: helm.Chart, url: str, address: str, database: str, tls: str
) -> None:
    values = with_worker({"serving": {"jobsUrl": url}}, queue="minilm", keda={"enabled": True})
    docs = render(chart, values)
    validate(docs, "1.33")
    metadata = redis_trigger(docs)["metadata"]
    assert (metadata["address"], metadata["databaseIndex"], metadata["enableTLS"]) == (
        address,
        database,
        tls,
    )


@pytest.mark.parametrize(
    "keda",
    [
        {"addressFromEnv": "REDIS_ADDRESS", "usernameFromEnv": "REDIS_USER", "databaseIndex": 2},
        {"authenticationRef": "redis-auth", "enableTLS": True},
        {"address": "redis:6379", "minReplicaCount": 0, "activationLagCount": 5},
    ],
    ids=["address-from-env", "trigger-authentication", "scale-to-zero"],
)
def test_keda_with_a_secret_url_and_every_metadata_value_a_string(
    chart: helm.Chart, keda: dict[str, Any]
) -> None:
    values = with_worker(
        {"serving": {"jobsUrl": "", "jobsUrlSecret": JOBS_SECRET}},
        queue="minilm",
        keda={"enabled": True, **keda},
    )
    docs = render(chart, values)
    validate(docs, "1.33")
    trigger = redis_trigger(docs)
    assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger["metadata"]
    if "authenticationRef" in keda:
        assert trigger["authenticationRef"] == {"name": keda["authenticationRef"]}
        assert "address" not in trigger["metadata"]
    for key in ("addressFromEnv", "usernameFromEnv", "address"):
        if key in keda:
            assert trigger["metadata"][key] == keda[key]
    assert trigger["metadata"]["databaseIndex"] == str(keda.get("databaseIndex", 0))
    assert trigger["metadata"]["enableTLS"] == str(keda.get("enableTLS", False)).lower()
    assert scaled_object(docs)["spec"]["minReplicaCount"] == keda.get("minReplicaCount", 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda so: so["spec"]["triggers"][0]["metadata"].update(streamLength=64),
            "is not of type",
        ),
        (lambda so: so["spec"]["scaleTargetRef"].pop("name"), "'name' is a required property"),
        (lambda so: so["spec"].update(replicas=3), "Additional properties are not allowed"),
    ],
    ids=["number-in-metadata", "no-target", "unknown-field"],
)
def test_kedas_crd_refuses_what_the_api_server_would(
    chart: helm.Chart, change: Any, message: str
) -> None:
    docs = render(chart, VALUE_SETS["values-worker"])
    so = copy.deepcopy(scaled_object(docs))
    change(so)
    with pytest.raises(jsonschema.ValidationError, match=re.escape(message)):
        SCALED_OBJECT.validate(so)


def readme_block(marker: str) -> dict[str, Any]:
    readme = (CHART / "README.md").read_text()
    block = re.search(rf"```yaml\n(# {re.escape(marker)}.*?)```", readme, re.S)
    assert block, f"README.md lost the {marker} block"
    return yaml.safe_load(block.group(1))  # type: ignore[no-any-return]


def test_readmes_time_lag_pair_renders_a_fast_server_and_slow_workers(chart: helm.Chart) -> None:
    fast_docs = render(chart, readme_block("fast.yaml"), name="fast")
    slow_docs = render(chart, readme_block("slow.yaml"), name="slow")
    for docs in (fast_docs, slow_docs):
        validate(docs, "1.33")
    fast = env_of(containers(find(fast_docs, "Deployment"))["app"])
    assert fast["SERVING_FOLLOWUP_QUEUE"] == "all-minilm-l6-v2"
    assert "worker" not in {
        d["metadata"]["labels"].get("app.kubernetes.io/component") for d in fast_docs
    }
    slow = redis_trigger(slow_docs)["metadata"]
    assert slow["stream"] == "serving-core:jobs:{all-minilm-l6-v2}:stream"
    assert find(slow_docs, "Deployment")["spec"]["replicas"] == 0
    # One Redis: both releases read SERVING_JOBS_URL from the same Secret key.
    urls = [
        e["valueFrom"]["secretKeyRef"]
        for docs in (fast_docs, slow_docs)
        for c in serving_core_containers(docs)
        for e in c["env"]
        if e["name"] == "SERVING_JOBS_URL"
    ]
    assert len(urls) == 3
    assert all(url == urls[0] for url in urls)
