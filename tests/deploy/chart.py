"""The chart as its tests see it, shared by tests/deploy/test_chart_*.py (and the docs'
tests): the values every render must take, Helm's own Go SDK (helm_python) to lint and
render the chart exactly as `helm install` would, Kubernetes' JSON schemas (strict:
unknown fields fail) to validate what it renders, and the lookups into the manifests.
"""

from __future__ import annotations

import contextlib
import copy
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from serving_core.commands.cli import main as serving_core_main
from serving_core.settings import PREFIX
from tests.deploy.keda_crd import HTTP_ROUTE, SCALED_OBJECT, TRIGGER_METADATA

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "serving-core"
EXAMPLES = sorted((CHART / "examples").glob("values-*.yaml"))
KUBE_VERSIONS = ["1.29", "1.33"]
# Custom resources: not in Kubernetes' schemas, checked field by field by the tests
# (and a ScaledObject against KEDA's own CRD, an HTTPRoute against the Gateway
# API's, in validate()).
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
}
# A tag of the form image.yml pushes for every commit; the in-repo chart needs one.
TAG = "sha-" + "0123456789abcdef" * 2 + "01234567"
# Every set of values the chart must take: its defaults (with the tag it cannot
# do without) and each example.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "chart-defaults": {"image": {"tag": TAG}},
    **{path.stem: yaml.safe_load(path.read_text()) for path in EXAMPLES},
}
# Each pod knob, set to something Kubernetes accepts.
POD_KNOBS: dict[str, Any] = {
    "image": {"tag": TAG},
    "nodeSelector": {"kubernetes.io/arch": "amd64"},
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Equal", "value": "true", "tolerationSeconds": 60},
    ],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "x"}},
                    },
                }
            ]
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
    "runtimeClassName": "nvidia",
    "priorityClassName": "serving-high",
    "podAnnotations": {"example.com/owner": "ml"},
    "extraEnv": [
        {"name": "HF_HOME", "value": "/models/cache"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
    ],
    "extraVolumes": [
        {"name": "model", "persistentVolumeClaim": {"claimName": "model", "readOnly": True}}
    ],
    "extraVolumeMounts": [{"name": "model", "mountPath": "/models", "readOnly": True}],
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any], name: str = "demo") -> list[dict[str, Any]]:
    """Every manifest the chart renders for ``values``, parsed; raises on a refusal."""
    manifests = chart.render(values, name=name, namespace="serving")
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def tagged(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with an image tag, which the in-repo chart needs."""
    values = copy.deepcopy(values)
    values.setdefault("image", {}).setdefault("tag", TAG)
    return values


def lint_errors(values: dict[str, Any], kube_version: str = "1.33") -> list[str]:
    """`helm lint --strict` findings of warning level and above."""
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{kube_version}.0")
    findings = [m["error"] for m in report["messages"] if m["severity"] >= 2]
    return findings + [e for e in report["errors"] if e not in findings]


def find(docs: list[dict[str, Any]], kind: str, component: str = "server") -> dict[str, Any]:
    matches = [
        doc
        for doc in docs
        if doc["kind"] == kind
        and doc["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    assert len(matches) == 1, f"expected one {kind} ({component}), got {len(matches)}"
    return matches[0]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return find(docs, "Deployment")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spec of every pod the release creates: Pods, and the templates of its controllers."""
    specs = []
    for doc in docs:
        spec = doc.get("spec", {})
        if doc["kind"] == "Pod":
            specs.append(spec)
        elif doc["kind"] == "CronJob":
            specs.append(spec["jobTemplate"]["spec"]["template"]["spec"])
        elif "template" in spec:
            specs.append(spec["template"]["spec"])
    return specs


def serving_core_containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every container of every pod the release creates that runs serving-core."""
    return [
        c
        for spec in pod_specs(docs)
        for c in spec["containers"] + spec.get("initContainers", [])
        if c.get("command", [""])[0] == "serving-core"
    ]


def validate(docs: list[dict[str, Any]], kube_version: str) -> None:
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) == ("keda.sh/v1alpha1", "ScaledObject"):
            SCALED_OBJECT.validate(doc)
            for trigger in doc["spec"]["triggers"]:
                assert set(trigger["metadata"]) <= TRIGGER_METADATA[trigger["type"]], trigger
        if (doc["apiVersion"], doc["kind"]) == ("gateway.networking.k8s.io/v1", "HTTPRoute"):
            HTTP_ROUTE.validate(doc)
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, kube_version, strict=True)


EMPTY_TAG_MESSAGE = (
    "image.tag is empty and this is the in-repo chart, whose appVersion (0.0.0-unreleased) "
    "is no image's tag: set image.tag to a tag image.yml pushed, sha-<full commit sha> for "
    "any pushed commit or 1.2.3 for release v1.2.3"
)


# Set from `stream`, in the stream worker's container only (tests/deploy/test_chart_stream.py).
STREAM_SETTINGS = {
    "source": "SERVING_STREAM_SOURCE",
    "sink": "SERVING_STREAM_SINK",
    "deadLetter": "SERVING_STREAM_DEAD_LETTER",
    "maxAttempts": "SERVING_STREAM_MAX_ATTEMPTS",
}


# What a Secret holds where a setting comes from one: a secretKeyRef cannot be
# resolved at render time, so the Settings check reads this sample in its place.
SECRET_SAMPLES = {
    "SERVING_CACHE_URL": "redis://:secret@redis.serving.svc:6379/0",
    "SERVING_JOBS_URL": "redis://:secret@redis.serving.svc:6379/1",
    "SERVING_STREAM_SOURCE": "amqp://serving:secret@rabbitmq.stream.svc:5672/%2F?queue=sentences",
    "SERVING_STREAM_SINK": "redis://:secret@redis.stream.svc:6379/0?stream=embeddings",
    "SERVING_STREAM_DEAD_LETTER": "amqp://serving:secret@rabbitmq.stream.svc:5672/%2F?exchange=&routing_key=dead",
}


def serving_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's SERVING_* variables, those from a Secret replaced by a sample value."""
    env = {}
    for entry in container.get("env", []):
        name = entry["name"]
        if not name.startswith(PREFIX):
            continue
        if "valueFrom" in entry:
            assert "secretKeyRef" in entry["valueFrom"], entry
            env[name] = SECRET_SAMPLES[name]
        else:
            env[name] = entry["value"]
    return env


def serving_core_commands() -> set[str]:
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        serving_core_main(["--help"])
    match = re.search(r"\{([\w,-]+)\}", help_text.getvalue())
    assert match, help_text.getvalue()
    return set(match.group(1).split(","))


# Prometheus, as a NetworkPolicy peer allowed to scrape the metrics port.
MONITORING = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


# An image digest of the form the chart takes.
DIGEST = "sha256:" + "0" * 64
# The job queue every pod shares, for the worker's tests.
JOBS_SECRET = {"name": "serving-jobs", "key": "url"}
# The inference cache's Redis URL, from a Secret.
CACHE_SECRET = {"name": "serving-cache", "key": "url"}
QUEUE_URL = "redis://redis.queue.svc:6379/0"


def is_subset(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where ``expected`` differs from ``actual``: dicts may omit keys, lists must match in full."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: {actual!r} is not a mapping"]
        problems = []
        for key, value in expected.items():
            if key not in actual:
                problems.append(f"{path}.{key}: missing")
            else:
                problems += is_subset(value, actual[key], f"{path}.{key}")
        return problems
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: {actual!r} differs from {expected!r}"]
        return [p for i, e in enumerate(expected) for p in is_subset(e, actual[i], f"{path}[{i}]")]
    return [] if expected == actual else [f"{path}: {actual!r} != {expected!r}"]


# A batch run of four shards, two at a time.
BATCH: dict[str, Any] = {
    "enabled": True,
    "args": ["--input", "/data/in.jsonl", "--output", "/data/out.jsonl"],
    "completions": 4,
    "parallelism": 2,
}


def with_worker(values: dict[str, Any] | None = None, **worker: Any) -> dict[str, Any]:
    """``values`` with the worker on, over the shared Redis queue it needs, and a tag."""
    values = tagged(values or {})
    values.setdefault("serving", {}).setdefault("jobsUrl", QUEUE_URL)
    values["worker"] = {"enabled": True, **values.get("worker", {}), **worker}
    return values


def worker_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = find(docs, "Deployment", "worker")["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]
