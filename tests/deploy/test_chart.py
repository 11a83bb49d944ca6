"""The Helm chart, checked with the real tools that run without a cluster.

Helm's own Go SDK (helm_python) lints and renders the chart exactly as
`helm install` would; every manifest is validated against Kubernetes' JSON
schemas (strict: unknown fields fail) for the oldest and newest versions we
support; the app container's environment goes through serving-core's own
Settings, and the nginx container's through the nginx image's renderer and
`nginx -t`, then in front of a real gunicorn.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import requests
import yaml

from serving_core.commands.cli import main as serving_core_main
from serving_core.cores import usable_cores
from serving_core.jobs.redis_connection import GROUP
from serving_core.jobs.redis_queue import RedisJobQueue
from serving_core.pipeline.config import read as read_pipeline
from serving_core.settings import PREFIX, Settings, SettingsError
from tests.deploy.keda_crd import scaled_object_validator
from tests.nginx_server import NGINX, nginx_t
from tests.nginx_server import render as render_nginx
from tests.servers import free_port, gunicorn_server

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "serving-core"
EXAMPLES = sorted((CHART / "examples").glob("values-*.yaml"))
KUBE_VERSIONS = ["1.29", "1.33"]
# Custom resources: not in Kubernetes' schemas, checked field by field below
# (and a ScaledObject against KEDA's own CRD, in validate()).
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
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


# KEDA's ScaledObject CRD (tests/deploy/keda/, the schema the API server applies),
# closed as strict field validation closes it: tests/deploy/keda_crd.py. Trigger
# metadata is map[string]string there, so a number in it is refused.
SCALED_OBJECT = scaled_object_validator()
# The redis-streams scaler's documented metadata keys (keda.sh/docs/*/scalers/redis-streams).
REDIS_STREAMS_METADATA = {
    "address",
    "host",
    "port",
    "addressFromEnv",
    "hostFromEnv",
    "portFromEnv",
    "usernameFromEnv",
    "passwordFromEnv",
    "stream",
    "consumerGroup",
    "pendingEntriesCount",
    "streamLength",
    "lagCount",
    "activationLagCount",
    "enableTLS",
    "unsafeSsl",
    "databaseIndex",
}
# The rabbitmq scaler's documented metadata keys (keda.sh/docs/2.17/scalers/rabbitmq-queue).
RABBITMQ_METADATA = {
    "host",
    "hostFromEnv",
    "usernameFromEnv",
    "passwordFromEnv",
    "protocol",
    "mode",
    "value",
    "activationValue",
    "queueName",
    "vhostName",
    "queueLength",
    "useRegex",
    "pageSize",
    "operation",
    "timeout",
    "excludeUnacknowledged",
    "unsafeSsl",
}
TRIGGER_METADATA = {"redis-streams": REDIS_STREAMS_METADATA, "rabbitmq": RABBITMQ_METADATA}


def validate(docs: list[dict[str, Any]], kube_version: str) -> None:
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) == ("keda.sh/v1alpha1", "ScaledObject"):
            SCALED_OBJECT.validate(doc)
            for trigger in doc["spec"]["triggers"]:
                assert set(trigger["metadata"]) <= TRIGGER_METADATA[trigger["type"]], trigger
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, kube_version, strict=True)


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


def test_serving_handler_overrides_the_images_handler_only_when_set(chart: helm.Chart) -> None:
    values = tagged({"serving": {"handler": "handlers/other/handler.py"}})
    app = containers(find(render(chart, values), "Deployment"))["app"]
    assert env_of(app)["SERVING_HANDLER"] == "handlers/other/handler.py"


EMPTY_TAG_MESSAGE = (
    "image.tag is empty and this is the in-repo chart, whose appVersion (0.0.0-unreleased) "
    "is no image's tag: set image.tag to a tag image.yml pushed, sha-<full commit sha> for "
    "any pushed commit or 1.2.3 for release v1.2.3"
)


def test_the_in_repo_chart_refuses_an_empty_tag_saying_which_tags_exist(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(EMPTY_TAG_MESSAGE)):
        chart.render({}, name="demo", namespace="serving")
    # `helm lint` only logs a `fail` (Helm's lint mode), so linting the bare
    # chart, as chart.yml does, stays green; install and template refuse.
    assert lint_errors({}) == []


@pytest.fixture(scope="module")
def packaged_chart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[helm.Chart]:
    """The chart as chart.yml packages it for tag v1.2.3: `helm package --app-version 1.2.3`."""
    copied = tmp_path_factory.mktemp("packaged") / "serving-core"
    shutil.copytree(CHART, copied)
    metadata = yaml.safe_load((copied / "Chart.yaml").read_text())
    metadata["appVersion"] = "1.2.3"
    (copied / "Chart.yaml").write_text(yaml.safe_dump(metadata))
    with helm.Chart.load(copied) as loaded:
        yield loaded


def test_the_packaged_chart_deploys_its_release_with_an_empty_tag(
    packaged_chart: helm.Chart,
) -> None:
    by_name = containers(find(render(packaged_chart, {}), "Deployment"))
    assert by_name["app"]["image"] == "ghcr.io/your-org/serving-core:1.2.3"
    assert by_name["nginx"]["image"] == "ghcr.io/your-org/serving-core-nginx:1.2.3"


def test_a_digest_pins_the_images(chart: helm.Chart) -> None:
    digest = "sha256:" + hashlib.sha256(b"image").hexdigest()
    values = {"image": {"tag": "1.0.0", "digest": digest}, "nginx": {"image": {"digest": digest}}}
    by_name = containers(find(render(chart, values), "Deployment"))
    assert by_name["app"]["image"] == f"ghcr.io/your-org/serving-core:1.0.0@{digest}"
    assert by_name["nginx"]["image"] == f"ghcr.io/your-org/serving-core-nginx:1.0.0@{digest}"


def test_digests_alone_deploy_without_the_placeholder_tag(chart: helm.Chart) -> None:
    digest = "sha256:" + hashlib.sha256(b"image").hexdigest()
    values = {"image": {"digest": digest}, "nginx": {"image": {"digest": digest}}}
    by_name = containers(find(render(chart, values), "Deployment"))
    assert by_name["app"]["image"] == f"ghcr.io/your-org/serving-core@{digest}"
    assert by_name["nginx"]["image"] == f"ghcr.io/your-org/serving-core-nginx@{digest}"


# --- settings: camelCase values -> SERVING_* env -> serving-core's Settings ------

SETTINGS_TABLE = [
    # value key, value, env var, as the env carries it
    ("handler", "handlers/echo/handler.py", "SERVING_HANDLER", "handlers/echo/handler.py"),
    ("workers", 3, "SERVING_WORKERS", "3"),
    ("workerClass", "gthread", "SERVING_WORKER_CLASS", "gthread"),
    ("workerConnections", 250, "SERVING_WORKER_CONNECTIONS", "250"),
    ("threads", 48, "SERVING_THREADS", "48"),
    ("maxBatchSize", 24, "SERVING_MAX_BATCH_SIZE", "24"),
    ("lendCores", False, "SERVING_LEND_CORES", "false"),
    ("maxWaitMs", 2.5, "SERVING_MAX_WAIT_MS", "2.5"),
    ("batchPolicy", "fixed", "SERVING_BATCH_POLICY", "fixed"),
    ("maxQueue", 1000000, "SERVING_MAX_QUEUE", "1000000"),
    ("requestTimeoutSeconds", 0.5, "SERVING_REQUEST_TIMEOUT_S", "0.5"),
    ("maxBodyBytes", 4194304, "SERVING_MAX_BODY_BYTES", "4194304"),
    ("maxJsonDepth", 16, "SERVING_MAX_JSON_DEPTH", "16"),
    ("maxStringChars", 1048576, "SERVING_MAX_STRING_CHARS", "1048576"),
    ("bodyTimeoutSeconds", 2.5, "SERVING_BODY_TIMEOUT_S", "2.5"),
    ("trustedProxies", ["10.0.0.0/8", "::1"], "SERVING_TRUSTED_PROXIES", "10.0.0.0/8,::1"),
    ("drainSeconds", 7.5, "SERVING_DRAIN_S", "7.5"),
    ("gracefulTimeoutSeconds", 45, "SERVING_GRACEFUL_TIMEOUT_S", "45"),
    ("keepaliveSeconds", 2, "SERVING_KEEPALIVE_S", "2"),
    ("maxRequests", 5000, "SERVING_MAX_REQUESTS", "5000"),
    ("maxRequestsJitter", 250, "SERVING_MAX_REQUESTS_JITTER", "250"),
    ("maxRssBytes", 2147483648, "SERVING_MAX_RSS_BYTES", "2147483648"),
    ("hangMarginSeconds", 4.5, "SERVING_HANG_MARGIN_S", "4.5"),
    ("logLevel", "debug", "SERVING_LOG_LEVEL", "debug"),
    ("logFormat", "json", "SERVING_LOG_FORMAT", "json"),
    ("docsEnabled", False, "SERVING_DOCS_ENABLED", "false"),
    ("device", "cuda:1", "SERVING_DEVICE", "cuda:1"),
    ("dtype", "bfloat16", "SERVING_DTYPE", "bfloat16"),
    ("modelProcess", "shared", "SERVING_MODEL_PROCESS", "shared"),
    ("modelProcesses", 2, "SERVING_MODEL_PROCESSES", "2"),
    (
        "cacheUrl",
        "rediss://cache.example.com:6380/2",
        "SERVING_CACHE_URL",
        "rediss://cache.example.com:6380/2",
    ),
    ("cacheSize", 250000, "SERVING_CACHE_SIZE", "250000"),
    ("cacheTtlSeconds", 0.25, "SERVING_CACHE_TTL_S", "0.25"),
    ("cachePerKey", False, "SERVING_CACHE_PER_KEY", "false"),
    ("cacheHeader", True, "SERVING_CACHE_HEADER", "true"),
    ("modelRevision", "sha256:abc", "SERVING_MODEL_REVISION", "sha256:abc"),
    ("jobsEnabled", True, "SERVING_JOBS_ENABLED", "true"),
    ("jobsUrl", "redis://queue:6379/1", "SERVING_JOBS_URL", "redis://queue:6379/1"),
    ("jobsPath", "/data/jobs.db", "SERVING_JOBS_PATH", "/data/jobs.db"),
    ("jobsMaxQueue", 5000, "SERVING_JOBS_MAX_QUEUE", "5000"),
    ("jobsMaxStored", 20000, "SERVING_JOBS_MAX_STORED", "20000"),
    ("jobsMaxPerCaller", 50, "SERVING_JOBS_MAX_PER_CALLER", "50"),
    ("jobsTtlSeconds", 600, "SERVING_JOBS_TTL_S", "600"),
    ("jobsMaxAttempts", 5, "SERVING_JOBS_MAX_ATTEMPTS", "5"),
    ("jobsLeaseSeconds", 30.5, "SERVING_JOBS_LEASE_S", "30.5"),
    ("followupQueue", "minilm-large", "SERVING_FOLLOWUP_QUEUE", "minilm-large"),
    ("apiKeys", "0123456789abcdef-key", "SERVING_API_KEYS", "0123456789abcdef-key"),
    ("apiKeysFile", "/keys/api-keys", "SERVING_API_KEYS_FILE", "/keys/api-keys"),
    ("privateEndpoints", True, "SERVING_PRIVATE_ENDPOINTS", "true"),
    ("publicMetadata", False, "SERVING_PUBLIC_METADATA", "false"),  # true contradicts private
    ("pipelineWithoutKeys", True, "SERVING_PIPELINE_WITHOUT_KEYS", "true"),
    (
        "corsOrigins",
        ["https://app.example.com", "http://localhost:3000"],
        "SERVING_CORS_ORIGINS",
        "https://app.example.com,http://localhost:3000",
    ),
]
# `serving` keys that feed a setting from a Secret (env valueFrom.secretKeyRef)
# instead of a value.
FROM_SECRETS = {
    "cacheUrlSecret": "SERVING_CACHE_URL",
    "jobsUrlSecret": "SERVING_JOBS_URL",
    "apiKeysSecret": "SERVING_API_KEYS_FILE",  # mounted as a file, not an env value
}
# Set by the chart itself, not from `serving`.
CHART_MANAGED = {"SERVING_BIND", "SERVING_METRICS_DIR", "SERVING_GRPC_PORT"}
# Set from `stream`, in the stream worker's container only (tests/deploy/test_chart_stream.py).
STREAM_SETTINGS = {
    "source": "SERVING_STREAM_SOURCE",
    "sink": "SERVING_STREAM_SINK",
    "deadLetter": "SERVING_STREAM_DEAD_LETTER",
    "maxAttempts": "SERVING_STREAM_MAX_ATTEMPTS",
}
# Issue 26 adds the stream settings to serving-core while the chart gets them: until
# this checkout's Settings has them, the checks that need them skip with this reason.
STREAM_PENDING = (
    "serving-core's Settings has no SERVING_STREAM_* fields in this checkout yet (issue 26); "
    "the chart's stream worker sets them"
    if "stream_source" not in {f.name for f in dataclasses.fields(Settings)}
    else ""
)


@pytest.mark.parametrize(("key", "value", "env", "expected"), SETTINGS_TABLE)
def test_each_serving_value_sets_its_env_var(
    chart: helm.Chart, key: str, value: Any, env: str, expected: str
) -> None:
    app = containers(find(render(chart, tagged({"serving": {key: value}})), "Deployment"))["app"]
    assert env_of(app)[env] == expected


def test_settings_table_covers_every_serving_value(chart: helm.Chart) -> None:
    assert {row[0] for row in SETTINGS_TABLE} | set(FROM_SECRETS) == set(chart.values["serving"])


def test_the_chart_sets_exactly_the_settings_serving_core_has() -> None:
    fields = {PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}
    if STREAM_PENDING:
        fields |= set(STREAM_SETTINGS.values())
    assert {row[2] for row in SETTINGS_TABLE} | CHART_MANAGED | set(STREAM_SETTINGS.values()) == (
        fields
    )


def test_rendered_env_is_what_serving_core_accepts(chart: helm.Chart) -> None:
    values = tagged({"serving": {row[0]: row[1] for row in SETTINGS_TABLE}})
    env = env_of(containers(find(render(chart, values), "Deployment"))["app"])
    serving_env = {k: v for k, v in env.items() if k.startswith(PREFIX)}
    settings = Settings.from_env(serving_env, cores=2)
    assert settings.workers == 3
    assert settings.worker_class == "gthread"
    assert settings.worker_connections == 250
    assert settings.threads == 48
    assert settings.max_wait_ms == 2.5
    assert settings.max_queue == 1000000
    assert settings.request_timeout_s == 0.5
    assert settings.max_body_bytes == 4194304
    assert (settings.log_format, settings.docs_enabled) == ("json", False)
    assert settings.device == "cuda:1"
    assert settings.dtype == "bfloat16"
    assert settings.cache_url == "rediss://cache.example.com:6380/2"
    assert settings.cache_size == 250000
    assert settings.cache_ttl_s == 0.25
    assert settings.jobs_enabled is True
    assert settings.jobs_url == "redis://queue:6379/1"
    assert (settings.jobs_max_queue, settings.jobs_ttl_s) == (5000, 600)
    assert (settings.jobs_max_attempts, settings.jobs_lease_s) == (5, 30.5)
    assert settings.drain_s == 7.5
    assert settings.bind == "unix:/run/serving/gunicorn.sock"
    assert settings.metrics_dir == "/run/metrics"
    assert (settings.max_requests, settings.max_requests_jitter) == (5000, 250)
    assert (settings.max_rss_bytes, settings.hang_margin_s) == (2147483648, 4.5)
    assert (settings.max_json_depth, settings.max_string_chars) == (16, 1048576)
    assert settings.body_timeout_s == 2.5
    assert settings.trusted_proxies == ("10.0.0.0/8", "::1")


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


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_serving_core_container_starts_without_a_settings_error(
    chart: helm.Chart, values_name: str
) -> None:
    runs_serving_core = serving_core_containers(render(chart, VALUE_SETS[values_name]))
    assert runs_serving_core
    if VALUE_SETS[values_name].get("worker", {}).get("enabled"):
        assert "worker" in {c["name"] for c in runs_serving_core}
    pending = False
    for container in runs_serving_core:
        if container["name"] == "stream" and STREAM_PENDING:
            pending = True
            continue
        # The whole env, extraEnv included: a SERVING_* name there reaches Settings too.
        env = serving_env(container)
        try:
            Settings.from_env(env, cores=2)
        except SettingsError as exc:
            pytest.fail(f"{values_name}, container {container['name']}: {exc}")
    if pending:
        pytest.skip(STREAM_PENDING)


def test_the_settings_check_sees_extra_env() -> None:
    # What the check above does with a name the chart would emit from extraEnv
    # if it let one through (it refuses them: see TEMPLATE_REFUSALS).
    with pytest.raises(SettingsError, match="SERVING_CACHE_HOST"):
        Settings.from_env({"SERVING_CACHE_HOST": "redis"}, cores=2)


# Commands the chart runs that issue 10 is adding to serving-core right now; the
# tests skip with this reason until the checkout has them, then check them.
PENDING_COMMANDS = {
    "batch": "serving-core has no `batch` command in this checkout yet (issue 10); "
    "the chart's batch Job runs `serving-core batch ARGS [--shards N]`",
    "stream": "serving-core has no `stream` command in this checkout yet (issue 26); "
    "the chart's stream Deployment runs `serving-core stream`",
}


def serving_core_commands() -> set[str]:
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        serving_core_main(["--help"])
    match = re.search(r"\{([\w,-]+)\}", help_text.getvalue())
    assert match, help_text.getvalue()
    return set(match.group(1).split(","))


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_serving_core_command_the_chart_runs_exists(
    chart: helm.Chart, values_name: str
) -> None:
    commands = serving_core_commands()
    pending = []
    for container in serving_core_containers(render(chart, VALUE_SETS[values_name])):
        probes = [container.get(p, {}).get("exec", {}) for p in ("startupProbe", "readinessProbe")]
        probes.append(container.get("livenessProbe", {}).get("exec", {}))
        for argv in [container["command"], *(p["command"] for p in probes if p)]:
            assert argv[0] == "serving-core"
            if argv[1] in PENDING_COMMANDS and argv[1] not in commands:
                pending.append(argv[1])
                continue
            assert argv[1] in commands, argv
    if pending:
        pytest.skip(PENDING_COMMANDS[pending[0]])


def test_workers_threads_and_handler_are_left_to_serving_core_by_default(
    chart: helm.Chart,
) -> None:
    env = env_of(containers(find(render(chart, tagged({})), "Deployment"))["app"])
    assert "SERVING_WORKERS" not in env
    assert "SERVING_THREADS" not in env
    assert "SERVING_HANDLER" not in env
    assert (env["SERVING_DEVICE"], env["SERVING_DTYPE"]) == ("cpu", "float32")


def test_extra_env_and_env_from_reach_the_app(chart: helm.Chart) -> None:
    app = containers(find(render(chart, VALUE_SETS["values-full"]), "Deployment"))["app"]
    by_name = {e["name"]: e for e in app["env"]}
    assert by_name["MODEL_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "model-secrets",
        "key": "token",
    }
    assert app["envFrom"] == [{"secretRef": {"name": "model-settings", "optional": True}}]


# --- the pod: knobs, GPU, probes, drain, security ---------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_pod_knobs_render_and_validate(chart: helm.Chart, kube_version: str) -> None:
    docs = render(chart, POD_KNOBS)
    validate(docs, kube_version)
    deployment = find(docs, "Deployment")
    pod = deployment["spec"]["template"]
    for key in (
        "nodeSelector",
        "tolerations",
        "affinity",
        "runtimeClassName",
        "priorityClassName",
    ):
        assert pod["spec"][key] == POD_KNOBS[key], key
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pod["metadata"]["annotations"] == POD_KNOBS["podAnnotations"]
    app = containers(deployment)["app"]
    assert app["env"][-2:] == POD_KNOBS["extraEnv"]
    assert POD_KNOBS["extraVolumes"][0] in pod["spec"]["volumes"]
    assert POD_KNOBS["extraVolumeMounts"][0] in app["volumeMounts"]
    assert POD_KNOBS["extraVolumeMounts"][0] not in containers(deployment)["nginx"]["volumeMounts"]


def test_pod_knobs_are_absent_unless_set(chart: helm.Chart) -> None:
    pod = find(render(chart, tagged({})), "Deployment")["spec"]["template"]
    for key in ("nodeSelector", "tolerations", "affinity", "runtimeClassName", "priorityClassName"):
        assert key not in pod["spec"], key
    assert "annotations" not in pod["metadata"]


def test_gpu_example_puts_one_model_on_one_gpu(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-gpu"])
    pod = pod_spec(docs)
    by_name = containers(find(docs, "Deployment"))
    app = by_name["app"]
    assert app["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["runtimeClassName"] == "nvidia"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    env = env_of(app)
    # One model copy on the card: the shared model process (auto on cuda) runs it
    # for every worker, however many there are.
    assert (env["SERVING_DEVICE"], env["SERVING_DTYPE"], env["SERVING_MODEL_PROCESS"]) == (
        "cuda",
        "float16",
        "auto",
    )
    assert int(env["SERVING_WORKERS"]) > 1
    settings = Settings(device=env["SERVING_DEVICE"], model_process="auto")
    assert settings.shared_model
    assert app["image"].endswith("-cu128")
    assert not by_name["nginx"]["image"].endswith("-cu128")


# The probes whose failure restarts the app container.
PROBES = [("startupProbe", "/readyz"), ("livenessProbe", "/healthz")]


@pytest.mark.parametrize(("probe", "path"), PROBES)
def test_app_probes_ask_the_app_itself_not_nginx(chart: helm.Chart, probe: str, path: str) -> None:
    by_name = containers(find(render(chart, tagged({})), "Deployment"))
    app = by_name["app"]
    nginx_ports = {p["containerPort"] for p in by_name["nginx"]["ports"]}
    nginx_ports |= {p["name"] for p in by_name["nginx"]["ports"]}
    assert "httpGet" not in app[probe]
    assert "tcpSocket" not in app[probe]
    assert not nginx_ports & set(app[probe]["exec"]["command"])
    # serving-core healthcheck asks SERVING_BIND (the unix socket) for the path,
    # and gives up a second before the kubelet does.
    timeout_s = str(app[probe]["timeoutSeconds"] - 1)
    assert app[probe]["exec"]["command"] == [
        "serving-core",
        "healthcheck",
        "--path",
        path,
        "--timeout-s",
        timeout_s,
    ]


def test_readiness_is_the_kubelets_get_on_the_metrics_port_not_a_process_in_the_app(
    chart: helm.Chart,
) -> None:
    # bench/probes.py: an exec probe's Python is throttled with the app at its CPU
    # limit; nginx hands this GET to the app outside its upstream cap (test_nginx.py).
    values = tagged({"nginx": {"port": 8181, "metricsPort": 9191}})
    by_name = containers(find(render(chart, values), "Deployment"))
    readiness = by_name["app"]["readinessProbe"]
    assert readiness["httpGet"] == {"path": "/readyz", "port": 9191}
    assert "exec" not in readiness
    assert {"containerPort": 9191, "name": "metrics", "protocol": "TCP"} in by_name["nginx"][
        "ports"
    ]
    assert {k: v for k, v in readiness.items() if k != "httpGet"} == {
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 2,
        "successThreshold": 1,
    }


def test_startup_probe_allows_minutes_to_load_the_model(chart: helm.Chart) -> None:
    startup = containers(find(render(chart, tagged({})), "Deployment"))["app"]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_nginx_has_probes_of_its_own(chart: helm.Chart) -> None:
    nginx = containers(find(render(chart, tagged({"nginx": {"port": 8181}})), "Deployment"))[
        "nginx"
    ]
    assert nginx["ports"][0] == {"name": "http", "containerPort": 8181, "protocol": "TCP"}
    for probe in ("readinessProbe", "livenessProbe"):
        assert nginx[probe]["httpGet"] == {"path": "/_nginx/healthz", "port": "http"}


def test_probe_timing_comes_from_values(chart: helm.Chart) -> None:
    app = containers(find(render(chart, VALUE_SETS["values-full"]), "Deployment"))["app"]
    assert app["startupProbe"]["failureThreshold"] == 90
    assert app["livenessProbe"]["periodSeconds"] == 15


def test_the_drain_the_prestop_and_the_grace_period_match(chart: helm.Chart) -> None:
    values = tagged({"serving": {"drainSeconds": 6.5, "gracefulTimeoutSeconds": 20.5}})
    pod = pod_spec(render(chart, values))
    by_name = {c["name"]: c for c in pod["containers"]}
    # The app drains on SIGTERM itself (/readyz 503 first): no pause before it.
    assert "lifecycle" not in by_name["app"]
    assert env_of(by_name["app"])["SERVING_DRAIN_S"] == "6.5"
    # nginx accepts as long as the app does.
    assert by_name["nginx"]["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "7"]}}
    assert pod["terminationGracePeriodSeconds"] == 7 + 21 + 5


def test_a_grace_period_shorter_than_the_drain_is_refused(chart: helm.Chart) -> None:
    values = tagged(
        {
            "serving": {"drainSeconds": 30, "gracefulTimeoutSeconds": 30},
            "lifecycle": {"terminationGracePeriodSeconds": 45},
        }
    )
    with pytest.raises(helm.HelmRenderError, match=r"terminationGracePeriodSeconds \(45\)"):
        render(chart, values)


def test_an_explicit_grace_period_wins(chart: helm.Chart) -> None:
    assert pod_spec(render(chart, VALUE_SETS["values-full"]))["terminationGracePeriodSeconds"] == 90


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_pod_is_non_root_read_only_and_drops_capabilities(
    chart: helm.Chart, values_name: str
) -> None:
    docs = render(chart, VALUE_SETS[values_name])
    pods = pod_specs(docs)
    # The server, the `helm test` pod, and the batch, worker and stream pods where enabled.
    optional = [
        VALUE_SETS[values_name].get(key, {}).get("enabled") for key in ("batch", "worker", "stream")
    ]
    assert len(pods) == 2 + sum(bool(enabled) for enabled in optional)
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}


def nginx_image_conf_path() -> str:
    """Where the nginx image's command reads its rendered configuration."""
    dockerfile = (ROOT / "nginx" / "Dockerfile").read_text()
    match = re.search(r'^CMD \[.*"-c", "(/[^"]+)"', dockerfile, re.MULTILINE)
    assert match, "nginx/Dockerfile's CMD no longer names its config with -c"
    return match.group(1)


def test_writable_paths_are_emptydirs(chart: helm.Chart) -> None:
    docs = render(chart, tagged({}))
    pod = pod_spec(docs)
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    by_name = containers(find(docs, "Deployment"))

    def writable(container: dict[str, Any]) -> set[str]:
        return {
            m["mountPath"]
            for m in container["volumeMounts"]
            if m["name"] in empty_dirs and not m.get("readOnly")
        }

    env = env_of(by_name["app"])
    socket_dir = env["SERVING_BIND"].removeprefix("unix:").rpartition("/")[0]
    assert writable(by_name["app"]) >= {"/tmp", socket_dir, env["SERVING_METRICS_DIR"]}
    # The nginx image renders its config (and keeps pid and temp files) next to it.
    conf_dir = nginx_image_conf_path().rpartition("/")[0]
    assert any(conf_dir.startswith(d + "/") or conf_dir == d for d in writable(by_name["nginx"]))
    # The socket directory is the same emptyDir in both containers.
    mounts = {
        c: {m["mountPath"]: m["name"] for m in by_name[c].get("volumeMounts", [])} for c in by_name
    }
    assert mounts["app"][socket_dir] == mounts["nginx"][socket_dir]


def test_topology_spread_gets_the_server_selector(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-full"])
    deployment = find(docs, "Deployment")
    constraints = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]
    for constraint in constraints:
        assert (
            constraint["labelSelector"]["matchLabels"]
            == deployment["spec"]["selector"]["matchLabels"]
        )


# --- the nginx sidecar: the image's own config, from env ------------------------


def test_nginx_is_configured_by_its_environment_only(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-full"])
    assert "ConfigMap" not in {d["kind"] for d in docs}
    nginx = containers(find(docs, "Deployment"))["nginx"]
    # The image's entrypoint renders the config, then runs nginx.
    assert "command" not in nginx
    assert "args" not in nginx
    assert not [v for v in pod_spec(docs)["volumes"] if "configMap" in v]


def test_nginx_takes_the_apps_socket_and_limits(chart: helm.Chart) -> None:
    values = tagged(
        {"serving": {"maxBodyBytes": 4194304, "requestTimeoutSeconds": 2.5, "keepaliveSeconds": 10}}
    )
    by_name = containers(find(render(chart, values), "Deployment"))
    app, nginx = env_of(by_name["app"]), env_of(by_name["nginx"])
    assert nginx["NGINX_UPSTREAM"] == app["SERVING_BIND"]
    for name in ("SERVING_MAX_BODY_BYTES", "SERVING_REQUEST_TIMEOUT_S", "SERVING_KEEPALIVE_S"):
        assert nginx[name] == app[name]
    assert (nginx["NGINX_PORT"], nginx["NGINX_METRICS_PORT"]) == ("8080", "9090")


def test_nginx_values_reach_its_environment(chart: helm.Chart) -> None:
    nginx = env_of(
        containers(find(render(chart, VALUE_SETS["values-full"]), "Deployment"))["nginx"]
    )
    assert nginx["NGINX_WORKER_PROCESSES"] == "2"
    assert nginx["NGINX_WORKER_CONNECTIONS"] == "4096"
    assert nginx["NGINX_CONN_LIMIT_PER_CLIENT"] == "64"
    assert nginx["NGINX_CLIENT_TIMEOUT_S"] == "5"
    assert nginx["NGINX_KEEPALIVE_TIMEOUT_S"] == "30"
    assert nginx["NGINX_UPSTREAM_KEEPALIVE"] == "64"
    assert (nginx["NGINX_RATE_LIMIT_RPS"], nginx["NGINX_RATE_LIMIT_BURST"]) == ("50", "100")
    assert nginx["NGINX_TRUSTED_PROXIES"] == "10.0.0.0/8"
    assert nginx["NGINX_LOG_LEVEL"] == "notice"
    assert nginx["NGINX_UPSTREAM_MAX_CONNS"] == "1024"


@pytest.mark.parametrize(
    ("serving", "resources", "expected"),
    [
        # The defaults: the CPU limit of 2 gives 2 workers x (2 x 16 queued + 16 running).
        ({}, None, "96"),
        ({"workers": 3, "maxBatchSize": 8, "maxQueue": 40}, None, "144"),
        # A fractional limit rounds down, as the app's own worker count does.
        ({}, {"limits": {"cpu": "1500m"}}, "48"),
        ({"maxBatchSize": 32}, {"limits": {"cpu": 4}}, "384"),
        # Neither workers nor a CPU limit: nothing to size it by, so off.
        ({}, {"limits": {"cpu": None}}, "0"),
    ],
)
def test_nginx_upstream_max_conns_auto_is_what_the_app_can_hold(
    chart: helm.Chart, serving: dict[str, Any], resources: dict[str, Any] | None, expected: str
) -> None:
    values: dict[str, Any] = {"serving": serving}
    if resources is not None:
        values["resources"] = {"requests": {"cpu": "100m"}, **resources}
    nginx = env_of(containers(find(render(chart, tagged(values)), "Deployment"))["nginx"])
    assert nginx["NGINX_UPSTREAM_MAX_CONNS"] == expected


# CPU limits and the cgroup v2 cpu.max the kubelet writes for each (quota =
# millicores x period / 1000, period 100 ms): what usable_cores() reads in the pod.
CPU_LIMITS = [
    ("100m", "10000 100000"),
    ("500m", "50000 100000"),
    ("1", "100000 100000"),
    ("1500m", "150000 100000"),
    ("2", "200000 100000"),
    ("2500m", "250000 100000"),
    (3.7, "370000 100000"),
    ("7999m", "799900 100000"),
    (16, "1600000 100000"),
]


@pytest.mark.parametrize(("limit", "cpu_max"), CPU_LIMITS)
def test_upstream_max_conns_auto_counts_the_workers_the_app_starts(
    chart: helm.Chart, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: Any, cpu_max: str
) -> None:
    # The app's side, for real: usable_cores() on the pod's cgroup (on a node with
    # more cores than any limit here) and Settings resolving the rendered env.
    (tmp_path / "cpu.max").write_text(cpu_max + "\n")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    for serving in ({}, {"maxBatchSize": 8, "maxQueue": 40}):
        values = tagged({"serving": serving, "resources": {"limits": {"cpu": limit}}})
        deployment = containers(find(render(chart, values), "Deployment"))
        settings = Settings.from_env(serving_env(deployment["app"]), cores=usable_cores(tmp_path))
        held = settings.workers * (settings.max_queue + settings.max_batch_size)
        assert env_of(deployment["nginx"])["NGINX_UPSTREAM_MAX_CONNS"] == str(held), serving


def test_nginx_upstream_max_conns_can_be_set_or_turned_off(chart: helm.Chart) -> None:
    for set_to in (0, 500):
        values = tagged({"nginx": {"upstreamMaxConns": set_to}})
        nginx = env_of(containers(find(render(chart, values), "Deployment"))["nginx"])
        assert nginx["NGINX_UPSTREAM_MAX_CONNS"] == str(set_to)
    with pytest.raises(Exception, match="upstreamMaxConns"):
        render(chart, tagged({"nginx": {"upstreamMaxConns": "lots"}}))


API_KEYS_SECRET = {"name": "serving-api-keys", "key": "api-keys"}


def test_api_keys_come_from_a_secret_mounted_in_the_app_container_only(
    chart: helm.Chart,
) -> None:
    serving = {"apiKeysSecret": API_KEYS_SECRET, "jobsUrl": "redis://queue:6379/0"}
    values = tagged({"serving": serving, "worker": {"enabled": True}})
    docs = render(chart, values)
    server = find(docs, "Deployment")
    app = containers(server)["app"]
    path = env_of(app)["SERVING_API_KEYS_FILE"]
    mount = next(m for m in app["volumeMounts"] if m["name"] == "api-keys")
    assert mount["readOnly"] is True
    assert "subPath" not in mount  # a subPath mount never sees the Secret change
    volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == "serving-api-keys"
    (item,) = volume["secret"]["items"]
    assert item["key"] == "api-keys"
    assert path == f"{mount['mountPath']}/{item['path']}"
    # nginx, the worker and the batch run no API: no keys mounted or named there.
    assert all(m["name"] != "api-keys" for m in containers(server)["nginx"]["volumeMounts"])
    worker = containers(find(docs, "Deployment", component="worker"))["worker"]
    assert "SERVING_API_KEYS_FILE" not in env_of(worker)
    assert all(m["name"] != "api-keys" for m in worker.get("volumeMounts", []))
    for kube_version in KUBE_VERSIONS:
        validate(docs, kube_version)


def test_without_a_keys_secret_nothing_is_mounted(chart: helm.Chart) -> None:
    docs = render(chart, tagged({}))
    app = containers(find(docs, "Deployment"))["app"]
    assert "SERVING_API_KEYS_FILE" not in env_of(app)
    assert "SERVING_API_KEYS" not in env_of(app)
    assert "SERVING_CORS_ORIGINS" not in env_of(app)
    assert all(v["name"] != "api-keys" for v in pod_spec(docs)["volumes"])


def nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if not found:
        pytest.fail("nginx is not installed; `make system-deps` installs it")
    return found


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_nginx_image_renders_a_config_nginx_accepts_from_the_charts_env(
    chart: helm.Chart, values_name: str
) -> None:
    nginx = nginx_binary()
    env = env_of(containers(find(render(chart, VALUE_SETS[values_name]), "Deployment"))["nginx"])
    with tempfile.TemporaryDirectory() as tmp:
        conf = render_nginx(env, Path(tmp) / "nginx")
        result = subprocess.run(
            [nginx, "-t", "-p", tmp, "-c", str(conf), "-e", "stderr"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        # Proxied to the app's socket, as the chart set it.
        assert "unix:/run/serving/gunicorn.sock" in conf.read_text()


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_charts_nginx_fronts_gunicorn_over_the_unix_socket(chart: helm.Chart) -> None:
    nginx = nginx_binary()
    api_port, metrics_port = free_port(), free_port()
    docs = render(chart, tagged({"serving": {"maxBodyBytes": 2000}}))
    by_name = containers(find(docs, "Deployment"))
    app_env, nginx_env = env_of(by_name["app"]), env_of(by_name["nginx"])
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # Under root, nginx's workers run as nobody: let them reach the socket.
        tmp.chmod(0o755)
        bind = app_env["SERVING_BIND"].replace("/run/serving/", f"{tmp}/")
        # The pod's environment, moved onto this machine: the socket under tmp,
        # free ports on 127.0.0.1.
        nginx_env |= {
            "NGINX_UPSTREAM": bind,
            "NGINX_PORT": str(api_port),
            "NGINX_METRICS_PORT": str(metrics_port),
            "NGINX_LISTEN_ADDRESS": "127.0.0.1",
        }
        conf = render_nginx(nginx_env, tmp / "nginx")
        overrides = {
            "SERVING_HANDLER": "handlers/echo/handler.py",
            "SERVING_WORKERS": "1",
            "SERVING_MAX_BODY_BYTES": app_env["SERVING_MAX_BODY_BYTES"],
            "SERVING_BIND": bind,
        }
        with gunicorn_server(overrides) as server, open(tmp / "nginx.log", "wb") as log:
            proxy = subprocess.Popen(
                [nginx, "-p", str(tmp), "-c", str(conf), "-e", "stderr", "-g", "daemon off;"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                api = f"http://127.0.0.1:{api_port}"
                metrics = f"http://127.0.0.1:{metrics_port}"
                wait_for(f"{metrics}/_nginx/healthz")

                ready = requests.get(f"{api}/readyz", timeout=5)
                assert ready.status_code == 200

                echoed = requests.post(
                    f"{api}/predict",
                    json={"a": 1},
                    headers={"X-Request-ID": "chart-e2e-1"},
                    timeout=5,
                )
                assert echoed.status_code == 200
                assert echoed.headers["X-Request-ID"] == "chart-e2e-1"
                # gunicorn writes the access-log line after the response has gone.
                deadline = time.monotonic() + 10
                while "request_id=chart-e2e-1" not in server.output():
                    assert time.monotonic() < deadline, server.output()
                    time.sleep(0.05)

                too_big = requests.post(
                    f"{api}/predict",
                    data=b"x" * 3000,
                    headers={"Content-Type": "application/json"},
                    timeout=5,
                )
                assert too_big.status_code == 413
                assert too_big.json()["error"]["type"] == "payload_too_large"

                # The app serves /metrics too, so a 404 on the API port is nginx
                # refusing it; the metrics port's answer is the app's.
                hidden = requests.get(f"{api}/metrics", timeout=5)
                assert hidden.status_code == 404
                assert hidden.json()["error"]["type"] == "not_found"
                scraped = requests.get(f"{metrics}/metrics", timeout=5)
                assert scraped.status_code == 200
                assert "# TYPE serving_" in scraped.text
            finally:
                proxy.terminate()
                proxy.wait(10)


def wait_for(url: str, timeout_s: float = 10.0) -> None:
    """Poll ``url`` until it answers 200, for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    pytest.fail(f"{url} did not answer within {timeout_s} s")


# --- Services: the API, and metrics on their own ---------------------------------


@pytest.mark.parametrize("service_type", ["ClusterIP", "NodePort", "LoadBalancer"])
def test_metrics_have_their_own_cluster_ip_service(chart: helm.Chart, service_type: str) -> None:
    docs = render(chart, tagged({"service": {"type": service_type}}))
    api = find(docs, "Service")
    metrics = find(docs, "Service", "metrics")
    assert api["spec"]["type"] == service_type
    assert [p["name"] for p in api["spec"]["ports"]] == ["http"]
    assert 9090 not in {p["port"] for p in api["spec"]["ports"]}
    assert metrics["metadata"]["name"] == f"{api['metadata']['name']}-metrics"
    assert metrics["spec"]["type"] == "ClusterIP"
    assert metrics["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    deployment = find(docs, "Deployment")
    for service in (api, metrics):
        assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_service_monitor_scrapes_the_metrics_service_only(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-full"])
    monitor = find(docs, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= find(docs, "Service", "metrics")["metadata"]["labels"].items()
    assert not selector.items() <= find(docs, "Service")["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    # The app's /metrics through nginx; then the nginx exporter's (nginx.exporter).
    endpoint, exporter = monitor["spec"]["endpoints"]
    assert endpoint == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
        "scrapeTimeout": "5s",
    }
    assert exporter["port"] == "nginx-metrics"


# --- NetworkPolicy ---------------------------------------------------------------

MONITORING = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
INGRESS_CONTROLLER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
}


def test_network_policy_is_off_by_default(chart: helm.Chart) -> None:
    assert "NetworkPolicy" not in {d["kind"] for d in render(chart, tagged({}))}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_network_policy_opens_the_api_and_keeps_metrics_to_the_scrapers(
    chart: helm.Chart, kube_version: str
) -> None:
    values = tagged({"networkPolicy": {"enabled": True, "metricsFrom": [MONITORING]}})
    docs = render(chart, values)
    validate(docs, kube_version)
    policy = find(docs, "NetworkPolicy")
    assert (
        policy["spec"]["podSelector"]["matchLabels"]
        == (find(docs, "Deployment")["spec"]["selector"]["matchLabels"])
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    api, metrics = policy["spec"]["ingress"]
    # No `from`: any source may call the API.
    assert api == {"ports": [{"port": "http", "protocol": "TCP"}]}
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [MONITORING]}


def test_network_policy_without_scrapers_closes_the_metrics_port(chart: helm.Chart) -> None:
    policy = find(render(chart, tagged({"networkPolicy": {"enabled": True}})), "NetworkPolicy")
    ports = [port["port"] for rule in policy["spec"]["ingress"] for port in rule["ports"]]
    assert ports == ["http"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_network_policy_limits_the_api_to_its_peers_and_helm_test(
    chart: helm.Chart, kube_version: str
) -> None:
    values = tagged({"networkPolicy": {"enabled": True, "apiFrom": [INGRESS_CONTROLLER]}})
    docs = render(chart, values)
    validate(docs, kube_version)
    api = find(docs, "NetworkPolicy")["spec"]["ingress"][0]
    test_pod = next(d for d in docs if d["kind"] == "Pod")
    peer, test_peer = api["from"]
    assert peer == INGRESS_CONTROLLER
    assert test_peer["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()


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


def test_helm_test_hook_calls_readyz_through_the_service(chart: helm.Chart) -> None:
    docs = render(chart, tagged({}))
    pod = next(d for d in docs if d["kind"] == "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = find(docs, "Service")
    url = pod["spec"]["containers"][0]["command"][-1]
    assert url == f"http://{service['metadata']['name']}.serving.svc:80/readyz"


SCHEDULING = ("nodeSelector", "tolerations", "affinity", "runtimeClassName", "priorityClassName")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_helm_test_pod_runs_where_the_server_runs_with_the_small_nginx_image(
    chart: helm.Chart, kube_version: str
) -> None:
    values = copy.deepcopy(VALUE_SETS["values-gpu"])
    values |= {key: POD_KNOBS[key] for key in SCHEDULING}
    docs = render(chart, values)
    validate(docs, kube_version)
    test_pod = next(d for d in docs if d["kind"] == "Pod")["spec"]
    server = pod_spec(docs)
    for key in SCHEDULING:
        assert test_pod[key] == server[key], key
    # Never the multi-GB CUDA app image (nor a GPU): the release's nginx image,
    # which every server pod has pulled already, with the wget it must carry.
    (container,) = test_pod["containers"]
    assert container["image"] == containers(find(docs, "Deployment"))["nginx"]["image"]
    assert not container["image"].endswith("-cu128")
    assert container["command"][0] == "wget"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert not {"nodeSelector", "tolerations", "runtimeClassName"} & set(
        next(d for d in render(chart, tagged({})) if d["kind"] == "Pod")["spec"]
    )


@pytest.mark.e2e
def test_helm_test_pods_command_fails_unless_readyz_answers_2xx(chart: helm.Chart) -> None:
    # The rendered command, run for real (Debian's wget here, busybox's in the
    # alpine image: both exit non-zero on an HTTP error) against a server that
    # answers 200 and then 503.
    (pod,) = [d for d in render(chart, tagged({})) if d["kind"] == "Pod"]
    command = pod["spec"]["containers"][0]["command"]
    statuses = iter([200, 503])

    class Readyz(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = next(statuses)
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}' if status == 200 else b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with http.server.HTTPServer(("127.0.0.1", 0), Readyz) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}/readyz"
        try:
            ok = subprocess.run([*command[:-1], url], capture_output=True, timeout=30, check=False)
            refused = subprocess.run(
                [*command[:-1], url], capture_output=True, timeout=30, check=False
            )
        finally:
            server.shutdown()
    assert (ok.returncode, ok.stdout) == (0, b'{"status": "ok"}')
    assert refused.returncode != 0


# --- global values, as Bitnami charts read them ---------------------------------

EVERY_POD = {
    "batch": {"enabled": True, "args": ["--input", "a", "--output", "b"]},
    "worker": {"enabled": True},
    "serving": {"jobsUrl": "redis://redis.queue.svc:6379/0"},
}


@pytest.mark.parametrize(
    ("repository", "registry", "expected"),
    [
        ("ghcr.io/acme/app", "mirror.example.com", "mirror.example.com/acme/app"),
        ("ghcr.io/acme/app", "mirror.example.com/ghcr/", "mirror.example.com/ghcr/acme/app"),
        ("localhost:5000/app", "mirror.example.com", "mirror.example.com/app"),
        # A Docker Hub path has no registry of its own: the mirror goes in front.
        ("acme/app", "mirror.example.com", "mirror.example.com/acme/app"),
    ],
)
def test_global_image_registry_replaces_the_registry_of_every_image(
    chart: helm.Chart, repository: str, registry: str, expected: str
) -> None:
    values = tagged({"image": {"repository": repository}, "global": {"imageRegistry": registry}})
    docs = render(chart, values | EVERY_POD)
    images = {c["image"] for spec in pod_specs(docs) for c in spec["containers"]}
    assert images == {f"{expected}:{TAG}", f"{expected}-nginx:{TAG}"}
    assert len(pod_specs(docs)) == 4  # server, worker, batch, helm test


def test_global_pull_secrets_join_the_pods_in_every_pod(chart: helm.Chart) -> None:
    values = tagged(
        {
            "global": {"imagePullSecrets": ["mirror", {"name": "ghcr"}]},
            "imagePullSecrets": [{"name": "ghcr"}, {"name": "own"}],
        }
    )
    specs = pod_specs(render(chart, values | EVERY_POD))
    assert len(specs) == 4
    for spec in specs:
        assert spec["imagePullSecrets"] == [{"name": "mirror"}, {"name": "ghcr"}, {"name": "own"}]
    for spec in pod_specs(render(chart, tagged({}) | EVERY_POD)):
        assert "imagePullSecrets" not in spec


# --- bad values are refused with a readable message ----------------------------

BAD_VALUES = [
    ({"replicaCount": "three"}, "at '/replicaCount': got string, want integer"),
    ({"serving": {"maxBatchSize": "16"}}, "at '/serving/maxBatchSize': got string, want integer"),
    ({"serving": {"requestTimeoutSeconds": 0}}, "at '/serving/requestTimeoutSeconds'"),
    ({"serving": {"batchPolicy": "greedy"}}, "at '/serving/batchPolicy'"),
    ({"serving": {"device": "gpu"}}, "at '/serving/device'"),
    ({"serving": {"dtype": "int8"}}, "at '/serving/dtype'"),
    ({"autoscaling": {"enabled": "yes"}}, "at '/autoscaling/enabled': got string, want boolean"),
    ({"replicas": 3}, "additional properties 'replicas' not allowed"),
    (
        {"serving": {"maxBatchsize": 8}},
        "at '/serving': additional properties 'maxBatchsize' not allowed",
    ),
    ({"serving": {"cacheUrl": "http://redis:6379"}}, "at '/serving/cacheUrl'"),
    (
        {"serving": {"cacheUrlSecret": {"nmae": "redis"}}},
        "at '/serving/cacheUrlSecret': additional properties 'nmae' not allowed",
    ),
    ({"serving": {"cacheSize": -1}}, "at '/serving/cacheSize'"),
    ({"batch": {"completion": 4}}, "at '/batch': additional properties 'completion' not allowed"),
    ({"batch": {"completions": 0}}, "at '/batch/completions'"),
    ({"batch": {"concurrencyPolicy": "Skip"}}, "at '/batch/concurrencyPolicy'"),
    ({"batch": {"schedule": "nightly"}}, "at '/batch/schedule'"),
    ({"batch": {"args": ["--input", 3]}}, "at '/batch/args/1': got number, want string"),
    ({"worker": {"enable": True}}, "at '/worker': additional properties 'enable' not allowed"),
    ({"worker": {"queue": "{minilm}"}}, "at '/worker/queue'"),
    ({"worker": {"port": 80}}, "at '/worker/port'"),
    ({"worker": {"keda": {"address": "redis://r:6379/0"}}}, "at '/worker/keda/address'"),
    ({"worker": {"keda": {"streamLength": 0}}}, "at '/worker/keda/streamLength'"),
    (
        {"worker": {"keda": {"passwordFromEnv": "REDIS-PASSWORD"}}},
        "at '/worker/keda/passwordFromEnv'",
    ),
    ({"serving": {"jobsEnabled": "yes"}}, "at '/serving/jobsEnabled'"),
    ({"nginx": {"image": {"tag": 1.25}}}, "at '/nginx/image/tag': got number, want string"),
    (
        {"tolerations": [{"key": "nvidia.com/gpu", "opertor": "Exists"}]},
        "at '/tolerations/0': additional properties 'opertor' not allowed",
    ),
    ({"extraVolumeMounts": [{"name": "model"}]}, "at '/extraVolumeMounts/0'"),
    (
        {"networkPolicy": {"metricsFrom": [{"namespaceSelecter": {}}]}},
        "at '/networkPolicy/metricsFrom/0'",
    ),
    ({"probes": {"liveness": {"timeoutSeconds": 1}}}, "at '/probes/liveness/timeoutSeconds'"),
    (
        {"pipeline": {"stageUrls": {"STAGE-URL": "http://stage"}}},
        "at '/pipeline/stageUrls': additional properties 'STAGE-URL' not allowed",
    ),
    (
        {"pipeline": {"stageUrls": {"STAGE_URL": "stage:8000"}}},
        "at '/pipeline/stageUrls/STAGE_URL'",
    ),
    ({"pipeline": {"stages": {}}}, "at '/pipeline': additional properties 'stages' not allowed"),
    (
        {"networkPolicy": {"egress": [{"ports": [{"port": 6379, "protocol": "tcp"}]}]}},
        "at '/networkPolicy/egress/0/ports/0/protocol'",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES)
def test_schema_refuses_bad_values_naming_the_key(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(tagged(values), name="demo", namespace="serving")
    assert "values don't meet the specifications of the schema" in str(refused.value)
    assert message in str(refused.value)
    assert any(message in error for error in lint_errors(tagged(values)))


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


DIGEST = "sha256:" + "0" * 64
# The job queue every pod shares, for the worker's tests.
JOBS_SECRET = {"name": "serving-jobs", "key": "url"}
QUEUE_URL = "redis://redis.queue.svc:6379/0"
TEMPLATE_REFUSALS = [
    ({}, EMPTY_TAG_MESSAGE),
    (
        {"image": {"digest": DIGEST}},
        "the nginx image has no tag: set nginx.image.tag (or image.tag, which it follows)",
    ),
    (
        {"serving": {"maxQueue": 8, "maxBatchSize": 16}},
        "serving.maxQueue (8) is smaller than serving.maxBatchSize (16)",
    ),
    (
        {"extraEnv": [{"name": "SERVING_MAX_BATCH_SIZE", "value": "8"}]},
        "extraEnv sets SERVING_MAX_BATCH_SIZE, which the chart sets from serving.maxBatchSize",
    ),
    (
        {"extraEnv": [{"name": "SERVING_DEVICE", "value": "cuda"}]},
        "extraEnv sets SERVING_DEVICE, which the chart sets from serving.device",
    ),
    (
        {"extraEnv": [{"name": "SERVING_BIND", "value": "0.0.0.0:8000"}]},
        "extraEnv sets SERVING_BIND, which the chart manages",
    ),
    (
        {"extraEnv": [{"name": "SERVING_GRPC_PORT", "value": "8001"}]},
        "extraEnv sets SERVING_GRPC_PORT, which the chart manages",
    ),
    (
        {"grpc": {"enabled": True}},  # serving.workerClass is gevent by default
        "grpc.enabled needs serving.workerClass gthread, not gevent",
    ),
    (
        {"grpc": {"enabled": True, "nginxPort": 8080}, "serving": {"workerClass": "gthread"}},
        "grpc.nginxPort (8080) is also nginx.port or nginx.metricsPort",
    ),
    (
        {
            "grpc": {"enabled": True, "nginxPort": 8082},
            "serving": {"workerClass": "gthread"},
            "nginx": {"exporter": {"enabled": True}},
        },
        "nginx.exporter.statusPort (8082) is also grpc.nginxPort",
    ),
    (
        {"extraEnv": [{"name": "SERVING_CACHE_URL", "value": "redis://redis:6379/0"}]},
        "extraEnv sets SERVING_CACHE_URL, which the chart sets from serving.cacheUrl",
    ),
    (
        {"extraEnv": [{"name": "SERVING_CACHE_HOST", "value": "redis"}]},
        "extraEnv sets SERVING_CACHE_HOST, which is not a serving-core setting",
    ),
    (
        {"serving": {"cacheUrl": "redis://r:6379/0", "cacheUrlSecret": {"name": "cache"}}},
        "serving.cacheUrl and serving.cacheUrlSecret.name (cache) are both set: keep one",
    ),
    ({"batch": {"enabled": True}}, "batch.enabled needs batch.args"),
    (
        {"batch": {"enabled": True, "completions": 4, "args": ["--input", "a", "--shards=2"]}},
        "batch.args has --shards=2, but batch.completions (4) shards the input already",
    ),
    (
        {"batch": {"enabled": True, "args": ["--input", "a"], "schedule": "@daily", "runId": "r2"}},
        "batch.runId (r2) names a one-shot Job's run, but batch.schedule (@daily) makes a CronJob",
    ),
    (
        {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
        "autoscaling.minReplicas (5) is larger than autoscaling.maxReplicas (2)",
    ),
    (
        {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 0}},
        "autoscaling.enabled needs a metric",
    ),
    ({"nginx": {"metricsPort": 8080}}, "nginx.port and nginx.metricsPort are both 8080"),
    (
        {"worker": {"enabled": True}},
        "worker.enabled needs a job queue every pod shares: set serving.jobsUrl",
    ),
    (
        {"worker": {"keda": {"enabled": True}}},
        "worker.keda.enabled scales the worker Deployment: set worker.enabled too",
    ),
    (
        {"worker": {"enabled": True, "keda": {"enabled": True}}, "serving": {"jobsUrl": QUEUE_URL}},
        "worker.keda.enabled needs worker.queue, the name of the handler the image runs",
    ),
    (
        {
            "worker": {"enabled": True, "queue": "minilm", "keda": {"enabled": True}},
            "serving": {"jobsUrlSecret": JOBS_SECRET},
        },
        "worker.keda.enabled needs the queue's Redis as KEDA reaches it (host:port, not a URL)",
    ),
    (
        {
            "worker": {"enabled": True, "queue": "minilm", "keda": {"enabled": True}},
            "serving": {"jobsUrl": "redis://:secret@redis:6379/0"},
        },
        "serving.jobsUrl carries a password, which KEDA cannot take from the URL",
    ),
    (
        {
            "worker": {
                "enabled": True,
                "queue": "minilm",
                "keda": {"enabled": True, "minReplicaCount": 5, "maxReplicaCount": 2},
            },
            "serving": {"jobsUrl": QUEUE_URL},
        },
        "worker.keda.minReplicaCount (5) is larger than worker.keda.maxReplicaCount (2)",
    ),
    (
        {"worker": {"keda": {"address": "redis:6379", "addressFromEnv": "REDIS_ADDRESS"}}},
        "worker.keda.address and worker.keda.addressFromEnv are both set: keep one",
    ),
    (
        {"serving": {"apiKeysFile": "/keys/api", "apiKeysSecret": {"name": "keys", "key": "k"}}},
        "serving.apiKeysFile and serving.apiKeysSecret.name (keys) are both set",
    ),
    (
        {"pipeline": {"stageUrls": {"SERVING_STAGE_URL": "http://stage"}}},
        "pipeline.stageUrls sets SERVING_STAGE_URL, but SERVING_* names are serving-core's",
    ),
    (
        {
            "pipeline": {"stageUrls": {"STAGE_URL": "http://stage"}},
            "extraEnv": [{"name": "STAGE_URL", "value": "http://other"}],
        },
        "extraEnv sets STAGE_URL, which pipeline.stageUrls sets too",
    ),
    (
        {
            "pipeline": {"stageUrls": {"STAGE_URL": "http://stage"}},
            "networkPolicy": {"enabled": True},
            "serving": {"cacheUrl": "redis://cache:6379/0", "jobsUrlSecret": JOBS_SECRET},
        },
        "limits the server pods' egress to DNS and the stages, but serving.cacheUrl and "
        "serving.jobsUrl needs Redis: add a rule for it to networkPolicy.egress",
    ),
]


@pytest.mark.parametrize(("values", "message"), TEMPLATE_REFUSALS)
def test_rules_beyond_the_schema_stop_the_render_saying_what_to_change(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    if values and "image" not in values:
        values = tagged(values)
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(values, name="demo", namespace="serving")


# --- documentation ---------------------------------------------------------------


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


def test_readme_shows_what_the_custom_handler_example_renders(chart: helm.Chart) -> None:
    readme = (CHART / "README.md").read_text()
    block = re.search(
        r"<!-- rendered: examples/values-custom-handler.yaml -->\n```yaml\n(.*?)```", readme, re.S
    )
    assert block, "README.md lost the rendered custom-handler Deployment"
    expected = yaml.safe_load(block.group(1))
    deployment = find(render(chart, VALUE_SETS["values-custom-handler"]), "Deployment")
    assert is_subset(expected, deployment) == []


def test_readme_shows_the_custom_handler_example_as_it_is() -> None:
    readme = (CHART / "README.md").read_text()
    block = re.search(
        r"<!-- example: examples/values-custom-handler.yaml -->\n```yaml\n(.*?)```", readme, re.S
    )
    assert block, "README.md lost the custom-handler example"
    assert yaml.safe_load(block.group(1)) == VALUE_SETS["values-custom-handler"]


def test_each_serving_value_names_its_variable_in_the_generated_table() -> None:
    # The table is generated from values.yaml's comments (tests/deploy/test_chart_docs.py);
    # here: each `serving` key's description names the variable it becomes.
    readme = (CHART / "README.md").read_text()
    rows = dict(re.findall(r"^\| `serving\.(\w+)` +\| ([^|]*)\|", readme, re.MULTILINE))
    wanted = {key: env for key, _, env, _ in SETTINGS_TABLE} | FROM_SECRETS
    assert set(rows) == set(wanted)
    assert {k: env for k, env in wanted.items() if env not in rows[k]} == {}


def test_readme_documents_every_pod_knob() -> None:
    readme = (CHART / "README.md").read_text()
    knobs = [key for key in POD_KNOBS if key != "image"] + ["networkPolicy", "envFrom"]
    assert [k for k in knobs if f"`{k}" not in readme] == []


# Kubernetes' own fields (probe timing, resource requests and limits), documented by
# the object they belong to.
KUBERNETES_FIELDS = {
    "periodSeconds",
    "timeoutSeconds",
    "failureThreshold",
    "successThreshold",
    "requests",
    "limits",
}


def test_every_chart_value_is_documented_in_values_yaml(chart: helm.Chart) -> None:
    schema = chart.schema
    assert schema is not None
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    stack: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z]\w*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [key for _, key in stack] + [match.group(2)]
        stack.append((indent, match.group(2)))
        node: dict[str, Any] | None = schema
        for key in path:
            node = (node or {}).get("properties", {}).get(key)
        if node is None or path[-1] in KUBERNETES_FIELDS:
            continue  # inside a Kubernetes object (resources, strategy ...)
        if not lines[number - 1].lstrip().startswith("#"):
            undocumented.append(".".join(path))
    assert undocumented == []


# Kubernetes objects the schema only partly describes: a TopologySpreadConstraint's
# many optional fields, a Volume's dozens of sources; and Helm's `global`, which a
# parent chart shares with all its subcharts, each reading its own keys.
OPEN_OBJECTS = {"topologySpreadConstraints[]", "extraVolumes[]", "global"}


def test_schema_refuses_unknown_keys_in_every_object_it_defines(chart: helm.Chart) -> None:
    open_objects = []

    def walk(node: dict[str, Any], path: str) -> None:
        if (
            "properties" in node
            and path not in OPEN_OBJECTS
            and node.get("additionalProperties") is not False
        ):
            open_objects.append(path or "<top>")
        for key, child in node.get("properties", {}).items():
            walk(child, f"{path}.{key}".lstrip("."))
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    schema = chart.schema
    assert schema is not None
    walk(schema, "")
    for name, definition in schema.get("definitions", {}).items():
        walk(definition, f"#{name}")
    assert open_objects == []


def test_schema_and_values_yaml_have_the_same_keys(chart: helm.Chart) -> None:
    schema = chart.schema
    assert schema is not None
    assert set(schema["properties"]) == set(chart.values)
    assert schema["additionalProperties"] is False


# --- every value the schema accepts changes the render ---------------------------

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
# Kubernetes objects the chart passes through whole: one value each.
WHOLE_OBJECTS = {
    "resources",
    "nginx.resources",
    "nginx.exporter.resources",
    "batch.resources",
    "worker.resources",
    "stream.resources",
}
WALK_QUEUE = "redis://redis.queue.svc:6379/0"
WALK_STREAM = {
    "source": "amqp://serving:pw@rabbitmq.stream.svc:5672/%2F?queue=sentences",
    "sink": "amqp://serving:pw@rabbitmq.stream.svc:5672/%2F?exchange=&routing_key=embeddings",
    "deadLetter": "amqp://serving:pw@rabbitmq.stream.svc:5672/%2F?exchange=&routing_key=dead",
}
WALK_REDIS_SOURCE = "redis://redis.stream.svc:6379/0?stream=sentences"
# Values that matter only with others, by path prefix: each leaf under a prefix is
# rendered with these values both before and after it changes (a context that
# sets the leaf to the walk's sample, such as an `enabled`, is left out).
WALK_CONTEXTS: list[tuple[str, dict[str, Any]]] = [
    ("batch.", {"batch": {"enabled": True}}),
    ("batch.", {"batch": {"args": ["--input", "a", "--output", "b"]}}),
    *[
        (f"batch.{key}", {"batch": {"schedule": "@daily"}})
        for key in (
            "timeZone",
            "concurrencyPolicy",
            "startingDeadlineSeconds",
            "successfulJobsHistoryLimit",
            "failedJobsHistoryLimit",
            "suspend",
            "ttlSecondsAfterFinished",
        )
    ],
    ("grpc.", {"serving": {"workerClass": "gthread"}}),
    ("grpc.", {"grpc": {"enabled": True}}),
    ("worker.", {"serving": {"jobsUrl": WALK_QUEUE}}),
    ("worker.", {"worker": {"enabled": True}}),
    ("worker.keda.", {"worker": {"keda": {"enabled": True}}}),
    ("worker.keda.", {"worker": {"queue": "model"}}),
    # The workers consume their handler's queue whatever this says: it names the
    # stream KEDA watches.
    ("worker.queue", {"worker": {"queue": "model", "keda": {"enabled": True}}}),
    *[
        # Only when KEDA's address does not come from a plain serving.jobsUrl.
        (
            f"worker.keda.{key}",
            {
                "serving": {"jobsUrl": "", "jobsUrlSecret": {"name": "jobs"}},
                "worker": {"keda": {"address": "redis.queue.svc:6379"}},
            },
        )
        for key in ("databaseIndex", "enableTLS")
    ],
    ("stream.", {"stream": WALK_STREAM}),
    ("stream.", {"stream": {"enabled": True}}),
    *[
        # A Secret's name and key matter only without the plain URL.
        (f"stream.{key}Secret.", {"stream": {key: "", f"{key}Secret": {"name": "urls"}}})
        for key in ("source", "sink", "deadLetter")
    ],
    ("stream.keda.", {"stream": {"keda": {"hostFromEnv": "RABBITMQ_HOST"}}}),
    ("stream.keda.", {"stream": {"keda": {"enabled": True}}}),
    *[
        # The redis-streams trigger's own values: with a Redis source.
        (f"stream.keda.{key}", {"stream": {"source": WALK_REDIS_SOURCE}})
        for key in ("stream", "consumerGroup", "redisMetric", "address", "passwordFromEnv")
    ],
    *[
        # Only when KEDA's address does not come from a plain redis:// source.
        (
            f"stream.keda.{key}",
            {"stream": {"source": WALK_REDIS_SOURCE, "keda": {"address": "redis:6379"}}},
        )
        for key in ("databaseIndex", "enableTLS")
    ],
    ("ingress.", {"ingress": {"enabled": True}}),
    ("autoscaling.", {"autoscaling": {"enabled": True}}),
    ("autoscaling.podsMetric.", {"autoscaling": {"podsMetric": {"enabled": True}}}),
    ("networkPolicy.", {"networkPolicy": {"enabled": True}}),
    ("metrics.serviceMonitor.", {"metrics": {"serviceMonitor": {"enabled": True}}}),
    ("metrics.grafanaDashboard.", {"metrics": {"grafanaDashboard": {"enabled": True}}}),
    ("metrics.prometheusRule.", {"metrics": {"prometheusRule": {"enabled": True}}}),
    ("serving.cacheUrlSecret.", {"serving": {"cacheUrlSecret": {"name": "cache"}}}),
    ("serving.jobsUrlSecret.", {"serving": {"jobsUrlSecret": {"name": "jobs"}}}),
    ("serving.apiKeysSecret.", {"serving": {"apiKeysSecret": {"name": "keys"}}}),
    ("serving.maxRequestsJitter", {"serving": {"maxRequests": 1000}}),
    ("nginx.rateLimit.burst", {"nginx": {"rateLimit": {"requestsPerSecond": 10}}}),
    ("nginx.exporter.", {"nginx": {"exporter": {"enabled": True}}}),
    ("serving.followupQueue", {"serving": {"jobsUrl": WALK_QUEUE}}),
    ("serving.threads", {"serving": {"workerClass": "gthread"}}),
    ("serving.workerConnections", {"serving": {"workerClass": "gevent"}}),
    ("extraVolumeMounts", {"extraVolumes": [{"name": "model", "emptyDir": {}}]}),
    ("batch.extraVolumeMounts", {"batch": {"extraVolumes": [{"name": "out", "emptyDir": {}}]}}),
]
# A value the schema takes, other than the default, where the walk cannot make one
# up from the type (strings, lists, objects).
WALK_SAMPLES: dict[str, Any] = {
    "nameOverride": "model",
    "fullnameOverride": "model-server",
    "global.imageRegistry": "mirror.example.com",
    "serving.modelRevision": "sha256:0123abcd",
    "global.imagePullSecrets": ["mirror"],
    "image.repository": "ghcr.io/acme/app",
    "image.tag": "1.2.3",
    "image.digest": DIGEST,
    "imagePullSecrets": [{"name": "ghcr"}],
    "serving.handler": "handlers/echo/handler.py",
    "serving.trustedProxies": ["10.0.0.0/8"],
    "serving.device": "cuda",
    "serving.maxQueue": 64,
    "serving.cacheUrl": "redis://cache:6379/0",
    "serving.cacheUrlSecret.name": "cache",
    "serving.jobsUrlSecret.name": "jobs",
    "serving.apiKeysSecret.name": "keys",
    "lifecycle.terminationGracePeriodSeconds": 120,
    "serving.cacheUrlSecret.key": "address",
    "serving.jobsUrl": WALK_QUEUE,
    "serving.jobsUrlSecret.key": "address",
    "serving.jobsPath": "/tmp/jobs.db",
    "serving.followupQueue": "next-model",
    "serving.apiKeys": "key-1",
    "serving.apiKeysFile": "/run/keys",
    "serving.apiKeysSecret.key": "api-keys",
    "serving.corsOrigins": ["https://app.example.com"],
    "pipeline.stageUrls": {"PREP_URL": "http://prep:8000"},
    "extraEnv": [{"name": "HF_HOME", "value": "/models"}],
    "envFrom": [{"configMapRef": {"name": "env"}}],
    "strategy": {"type": "Recreate"},
    "resources": {"limits": {"cpu": "4", "memory": "2Gi"}},
    "nginx.image.repository": "ghcr.io/acme/nginx",
    "nginx.image.tag": "1.2.4",
    "nginx.image.digest": DIGEST,
    "nginx.workerProcesses": "auto",
    "nginx.upstreamMaxConns": 500,
    "nginx.resources": {"limits": {"memory": "256Mi"}},
    "nginx.trustedProxies": ["10.0.0.0/8"],
    "nginx.exporter.image.repository": "ghcr.io/nginx/nginx-prometheus-exporter",
    "nginx.exporter.image.tag": "1.5.0",
    "nginx.exporter.image.digest": DIGEST,
    "nginx.exporter.resources": {"limits": {"memory": "64Mi"}},
    "service.annotations": {"example.com/lb": "internal"},
    "ingress.className": "nginx",
    "ingress.annotations": {"example.com/tls": "yes"},
    "ingress.hosts": [{"host": "a.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
    "ingress.tls": [{"secretName": "tls", "hosts": ["a.example.com"]}],
    "autoscaling.podsMetric.name": "serving_in_flight",
    "autoscaling.podsMetric.averageValue": "4",
    "autoscaling.behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
    "podDisruptionBudget.maxUnavailable": "50%",
    "serviceAccount.name": "model",
    "serviceAccount.annotations": {"example.com/role": "reader"},
    "metrics.serviceMonitor.interval": "15s",
    "metrics.serviceMonitor.scrapeTimeout": "5s",
    "metrics.serviceMonitor.labels": {"release": "kps"},
    "metrics.grafanaDashboard.labels": {"grafana_dashboard": "2"},
    "metrics.prometheusRule.labels": {"release": "kps"},
    "metrics.prometheusRule.runbookBaseUrl": "https://runbooks.example.com/serving-core",
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 20001},
    "securityContext": {"runAsUser": 20002},
    "tmpSizeLimit": "1Gi",
    "podAnnotations": {"example.com/owner": "ml"},
    "podLabels": {"team": "ml"},
    "priorityClassName": "serving-high",
    "nodeSelector": {"kubernetes.io/arch": "arm64"},
    "tolerations": [{"key": "spot", "operator": "Exists"}],
    "affinity.nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
        }
    },
    "affinity.podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 1,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "cache"}},
                },
            }
        ]
    },
    "affinity.podAntiAffinity": POD_KNOBS["affinity"]["podAntiAffinity"],
    "topologySpreadConstraints": POD_KNOBS["topologySpreadConstraints"],
    "networkPolicy.apiFrom": [{"podSelector": {"matchLabels": {"app": "client"}}}],
    "networkPolicy.metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "mon"}}}],
    "networkPolicy.egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}],
    "runtimeClassName": "nvidia",
    "extraVolumes": [{"name": "model", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "model", "mountPath": "/models"}],
    "batch.args": ["--input", "c", "--output", "d"],
    "batch.schedule": "0 2 * * *",
    "batch.runId": "2026-12-01",
    "batch.timeZone": "Europe/Berlin",
    "batch.podFailurePolicy": {"rules": []},
    "batch.resources": {"limits": {"cpu": "8"}},
    "batch.extraVolumes": [{"name": "out", "emptyDir": {}}],
    "batch.extraVolumeMounts": [{"name": "out", "mountPath": "/out"}],
    "worker.queue": "other-model",
    "worker.resources": {"limits": {"cpu": "8"}},
    "worker.keda.address": "redis.other.svc:6379",
    "worker.keda.addressFromEnv": "REDIS_ADDRESS",
    "worker.keda.usernameFromEnv": "REDIS_USER",
    "worker.keda.passwordFromEnv": "REDIS_PASSWORD",
    "worker.keda.authenticationRef": "redis-auth",
    "stream.source": "amqp://serving:pw@rabbitmq.other.svc:5672/%2F?queue=other",
    "stream.sourceSecret.name": "stream-urls",
    "stream.sourceSecret.key": "in",
    "stream.sink": "redis://redis.stream.svc:6379/0?stream=embeddings",
    "stream.sinkSecret.name": "stream-urls",
    "stream.sinkSecret.key": "out",
    "stream.deadLetter": "redis://redis.stream.svc:6379/0?stream=dead",
    "stream.deadLetterSecret.name": "stream-urls",
    "stream.deadLetterSecret.key": "dead",
    "stream.resources": {"limits": {"cpu": "8"}},
    "stream.keda.queueName": "other-queue",
    "stream.keda.hostFromEnv": "AMQP_URL",
    "stream.keda.stream": "other-stream",
    "stream.keda.consumerGroup": "other-group",
    "stream.keda.address": "redis.other.svc:6379",
    "stream.keda.passwordFromEnv": "REDIS_PASSWORD",
    "stream.keda.authenticationRef": "rabbitmq-auth",
}
# Leaves that change nothing by themselves, with the reason.
WALK_EXCEPTIONS: dict[str, str] = {
    "stream.keda.broker": "a plain stream.source's scheme names the broker already, and with "
    "sourceSecret the chart refuses to render without it (test_chart_stream.py)",
}


def resolved(node: dict[str, Any]) -> dict[str, Any]:
    """``node``, or the schema node its $ref names."""
    while "$ref" in node:
        target = SCHEMA
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def schema_leaves(node: dict[str, Any], path: str = "") -> list[str]:
    """The paths of every value the schema describes: its leaves, whole objects as one."""
    node = resolved(node)
    children = node.get("properties", {})
    if not children or path in WHOLE_OBJECTS:
        return [path]
    return [
        leaf
        for key, child in children.items()
        for leaf in schema_leaves(child, f"{path}.{key}".lstrip("."))
    ]


def at(values: Any, path: str) -> Any:
    for key in path.split("."):
        values = values.get(key) if isinstance(values, dict) else None
    return values


def merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``more`` over it, objects merged key by key as Helm merges values."""
    out = copy.deepcopy(base)
    for key, value in more.items():
        if isinstance(value, dict) and value and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def nested(path: str, value: Any) -> dict[str, Any]:
    for key in reversed(path.split(".")):
        value = {key: value}
    return value  # type: ignore[no-any-return]


def sample(path: str, node: dict[str, Any]) -> Any:
    """A value the schema takes for ``path`` that is not its default."""
    if path in WALK_SAMPLES:
        return WALK_SAMPLES[path]
    default = at(DEFAULTS, path)
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "enum" in node:
        return next(v for v in node["enum"] if v != default)
    if "boolean" in kinds:
        return not default
    if "number" in kinds and 0 < default < 1:
        return default / 2  # a ratio
    if "integer" in kinds or "number" in kinds:
        if "maximum" in node and default + 1 > node["maximum"]:
            return default - 1
        return default + 1
    raise AssertionError(f"{path}: add a value the schema takes to WALK_SAMPLES")


def schema_node(path: str) -> dict[str, Any]:
    node = SCHEMA
    for key in path.split("."):
        node = resolved(node["properties"][key])
    return node


@pytest.mark.parametrize("path", schema_leaves(SCHEMA))
def test_every_value_the_schema_takes_changes_the_render(chart: helm.Chart, path: str) -> None:
    if path in WALK_EXCEPTIONS:
        pytest.skip(WALK_EXCEPTIONS[path])
    base = tagged({})
    value = sample(path, schema_node(path))
    for prefix, context in WALK_CONTEXTS:
        if path.startswith(prefix) and at(context, path) != value:
            base = merged(base, context)
    changed = merged(base, nested(path, value))
    assert at(changed, path) == value
    assert render(chart, changed) != render(chart, base), f"{path}: {value!r} changed nothing"


# --- gRPC: the app's front, nginx's h2c listener, the Service's grpc port ---------

GRPC_ON = {"grpc": {"enabled": True}, "serving": {"workerClass": "gthread"}}


def test_grpc_is_off_by_default(chart: helm.Chart) -> None:
    docs = render(chart, tagged({}))
    assert [p["name"] for p in find(docs, "Service")["spec"]["ports"]] == ["http"]
    pod = containers(find(docs, "Deployment"))
    assert "SERVING_GRPC_PORT" not in env_of(pod["app"])
    assert "NGINX_GRPC_PORT" not in env_of(pod["nginx"])


def test_grpc_on_exposes_nginx_h2c_listener_with_app_protocol_grpc(chart: helm.Chart) -> None:
    docs = render(chart, tagged(GRPC_ON))
    ports = {p["name"]: p for p in find(docs, "Service")["spec"]["ports"]}
    assert ports["grpc"] == {
        "name": "grpc",
        "port": 8081,
        "targetPort": "grpc",
        "protocol": "TCP",
        "appProtocol": "grpc",
    }
    pod = containers(find(docs, "Deployment"))
    app, nginx = env_of(pod["app"]), env_of(pod["nginx"])
    (grpc_port,) = [p for p in pod["nginx"]["ports"] if p["name"] == "grpc"]
    assert str(grpc_port["containerPort"]) == nginx["NGINX_GRPC_PORT"]
    # nginx reaches the app's gRPC port on the pod's loopback, the host the app
    # takes from SERVING_BIND; the settings serving-core itself accepts.
    assert nginx["NGINX_GRPC_UPSTREAM"] == f"127.0.0.1:{app['SERVING_GRPC_PORT']}"
    assert nginx["NGINX_UPSTREAM"] == app["SERVING_BIND"] == "127.0.0.1:8000"
    Settings.from_env(serving_env(pod["app"]), cores=2)
    # The probes do not change.
    off = containers(
        find(render(chart, tagged({"serving": {"workerClass": "gthread"}})), "Deployment")
    )
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert pod["app"][probe] == off["app"][probe]
        assert pod["nginx"].get(probe) == off["nginx"].get(probe)


@pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed (make system-deps)")
def test_grpc_sidecar_env_renders_a_config_nginx_accepts(chart: helm.Chart, tmp_path: Path) -> None:
    nginx = env_of(containers(find(render(chart, tagged(GRPC_ON)), "Deployment"))["nginx"])
    tested = nginx_t(render_nginx(nginx, tmp_path / "conf"))
    assert tested.returncode == 0, tested.stderr


# --- the inference cache's Redis URL ----------------------------------------------

CACHE_SECRET = {"name": "serving-cache", "key": "url"}


def test_cache_url_from_a_secret_renders_as_a_secret_key_ref(chart: helm.Chart) -> None:
    values = tagged({"serving": {"cacheUrlSecret": CACHE_SECRET}, "batch": BATCH})
    for container in serving_core_containers(render(chart, values)):
        (entry,) = [e for e in container["env"] if e["name"] == "SERVING_CACHE_URL"]
        assert entry == {"name": "SERVING_CACHE_URL", "valueFrom": {"secretKeyRef": CACHE_SECRET}}


def test_redis_example_takes_the_cache_url_from_a_secret(chart: helm.Chart) -> None:
    app = containers(find(render(chart, VALUE_SETS["values-cache-redis"]), "Deployment"))["app"]
    by_name = {e["name"]: e for e in app["env"]}
    assert by_name["SERVING_CACHE_URL"]["valueFrom"]["secretKeyRef"] == CACHE_SECRET
    assert Settings.from_env(serving_env(app), cores=2).cache_url.startswith("redis://")


def test_cache_url_as_a_value_or_not_at_all(chart: helm.Chart) -> None:
    def env(values: dict[str, Any]) -> dict[str, str]:
        return env_of(containers(find(render(chart, tagged(values)), "Deployment"))["app"])

    # Unset: each worker's in-memory cache.
    assert "SERVING_CACHE_URL" not in env({})
    assert env({"serving": {"cacheUrl": "redis://redis:6379/0"}})["SERVING_CACHE_URL"] == (
        "redis://redis:6379/0"
    )


# --- batch: `serving-core batch` as an Indexed Job or a CronJob -------------------

BATCH: dict[str, Any] = {
    "enabled": True,
    "args": ["--input", "/data/in.jsonl", "--output", "/data/out.jsonl"],
    "completions": 4,
    "parallelism": 2,
}


def batch_job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch Job's spec, or the CronJob's job template's."""
    kinds = {
        d["kind"]
        for d in docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "batch"
    }
    if kinds == {"CronJob"}:
        return find(docs, "CronJob", "batch")["spec"]["jobTemplate"]["spec"]  # type: ignore[no-any-return]
    return find(docs, "Job", "batch")["spec"]  # type: ignore[no-any-return]


def test_batch_is_off_by_default(chart: helm.Chart) -> None:
    kinds = {d["kind"] for d in render(chart, tagged({}))}
    assert not kinds & {"Job", "CronJob"}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_batch_job_is_indexed_with_the_values_completions_and_parallelism(
    chart: helm.Chart, kube_version: str
) -> None:
    docs = render(
        chart, tagged({"batch": BATCH | {"backoffLimit": 2, "activeDeadlineSeconds": 3600}})
    )
    validate(docs, kube_version)
    assert "CronJob" not in {d["kind"] for d in docs}
    spec = batch_job(docs)
    assert spec["completionMode"] == "Indexed"
    assert (spec["completions"], spec["parallelism"]) == (4, 2)
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (2, 3600)
    # Kept once finished: an upgrade that found it deleted would run it again.
    assert "ttlSecondsAfterFinished" not in spec
    pod = spec["template"]["spec"]
    # A retry is a new pod (the failed one keeps its logs); podFailurePolicy needs Never.
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == ["serving-core", "batch"]
    # Each pod reads its index from JOB_COMPLETION_INDEX; the chart says how many.
    assert container["args"] == [*BATCH["args"], "--shards", "4"]


@pytest.mark.parametrize("none", [{"rules": []}, None])
def test_no_pod_failure_policy_counts_every_failed_pod(chart: helm.Chart, none: Any) -> None:
    # Not {}: Helm merges an empty map into the default policy, leaving it as it is.
    assert "podFailurePolicy" in batch_job(render(chart, tagged({"batch": BATCH})))
    spec = batch_job(render(chart, tagged({"batch": BATCH | {"podFailurePolicy": none}})))
    assert "podFailurePolicy" not in spec


def test_one_completion_runs_the_whole_input_without_shards(chart: helm.Chart) -> None:
    values = tagged({"batch": BATCH | {"completions": 1, "parallelism": 1}})
    (container,) = batch_job(render(chart, values))["template"]["spec"]["containers"]
    assert container["args"] == BATCH["args"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_a_schedule_makes_it_a_cronjob_running_the_same_job(
    chart: helm.Chart, kube_version: str
) -> None:
    scheduled = BATCH | {"schedule": "0 2 * * *", "timeZone": "Europe/Berlin"}
    docs = render(chart, tagged({"batch": scheduled}))
    validate(docs, kube_version)
    assert "Job" not in {d["kind"] for d in docs}
    cronjob = find(docs, "CronJob", "batch")
    assert cronjob["spec"]["schedule"] == "0 2 * * *"
    assert cronjob["spec"]["timeZone"] == "Europe/Berlin"
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    # The CronJob's Jobs are its own to delete; Helm never recreates them.
    cron_spec = batch_job(docs)
    assert cron_spec.pop("ttlSecondsAfterFinished") == 86400
    assert cron_spec == batch_job(render(chart, tagged({"batch": BATCH})))


@pytest.mark.parametrize("schedule", ["", "@daily"])
def test_batch_pods_have_no_nginx_no_ports_and_no_probes(chart: helm.Chart, schedule: str) -> None:
    docs = render(chart, tagged({"batch": BATCH | {"schedule": schedule}}))
    pod = batch_job(docs)["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["batch"]
    (container,) = pod["spec"]["containers"]
    assert not {"ports", "startupProbe", "readinessProbe", "livenessProbe"} & set(container)
    # No Service, disruption budget or network policy selects them.
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "batch"
    for service in (d for d in docs if d["kind"] == "Service"):
        assert not service["spec"]["selector"].items() <= labels.items()


def test_batch_runs_the_servers_image_handler_and_settings(chart: helm.Chart) -> None:
    values = tagged(
        {
            "serving": {
                "handler": "handlers/other/handler.py",
                "device": "cuda",
                "dtype": "float16",
                "cacheUrlSecret": CACHE_SECRET,
            },
            "batch": BATCH,
        }
    )
    docs = render(chart, values)
    app = containers(find(docs, "Deployment"))["app"]
    (batch,) = batch_job(docs)["template"]["spec"]["containers"]
    assert batch["image"] == app["image"]
    # The same environment, less gunicorn's socket, which nothing serves here.
    assert batch["env"] == [e for e in app["env"] if e["name"] != "SERVING_BIND"]
    assert env_of(batch)["SERVING_HANDLER"] == "handlers/other/handler.py"
    assert batch["resources"] == app["resources"]
    assert batch["securityContext"] == app["securityContext"]


def test_batch_resources_override_the_servers(chart: helm.Chart) -> None:
    resources = {"requests": {"cpu": "8", "memory": "4Gi"}, "limits": {"cpu": "8", "memory": "6Gi"}}
    values = tagged({"batch": BATCH | {"resources": resources}})
    (batch,) = batch_job(render(chart, values))["template"]["spec"]["containers"]
    assert batch["resources"] == resources


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_batch_pods_take_the_pod_knobs(chart: helm.Chart, kube_version: str) -> None:
    output = {"name": "output", "persistentVolumeClaim": {"claimName": "batch-output"}}
    output_mount = {"name": "output", "mountPath": "/data"}
    values = POD_KNOBS | {
        "batch": BATCH | {"extraVolumes": [output], "extraVolumeMounts": [output_mount]}
    }
    docs = render(chart, values)
    validate(docs, kube_version)
    pod = batch_job(docs)["template"]
    for key in ("nodeSelector", "tolerations", "affinity", "runtimeClassName", "priorityClassName"):
        assert pod["spec"][key] == POD_KNOBS[key], key
    assert pod["metadata"]["annotations"] == POD_KNOBS["podAnnotations"]
    (batch,) = pod["spec"]["containers"]
    assert batch["env"][-2:] == POD_KNOBS["extraEnv"]
    assert pod["spec"]["volumes"][-2:] == [*POD_KNOBS["extraVolumes"], output]
    assert batch["volumeMounts"][-2:] == [*POD_KNOBS["extraVolumeMounts"], output_mount]
    # The batch pods' own volumes stay out of the server pods.
    assert output not in pod_spec(docs)["volumes"]


def test_batch_writes_only_to_emptydirs_and_volumes_it_is_given(chart: helm.Chart) -> None:
    docs = render(chart, tagged({"batch": BATCH}))
    pod = batch_job(docs)["template"]["spec"]
    (batch,) = pod["containers"]
    assert batch["securityContext"]["readOnlyRootFilesystem"] is True
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    writable = {m["mountPath"] for m in batch["volumeMounts"] if m["name"] in empty_dirs}
    assert writable == {"/tmp", env_of(batch)["SERVING_METRICS_DIR"]}


def test_the_job_is_named_after_its_run_and_only_a_new_run_renames_it(chart: helm.Chart) -> None:
    def job_name(values: dict[str, Any]) -> str:
        return find(render(chart, tagged(values)), "Job", "batch")["metadata"]["name"]  # type: ignore[no-any-return]

    # `helm upgrade` with the same run renders the same Job, which Helm then
    # leaves as it is (finished or not): the run is not started again.
    name = job_name({"batch": BATCH})
    assert job_name({"batch": BATCH}) == name
    assert job_name({"batch": BATCH, "replicaCount": 5}) == name
    # A Job's pod template is immutable: a changed run is a new Job ...
    assert (
        job_name({"batch": BATCH | {"args": ["--input", "a.jsonl", "--output", "b.jsonl"]}}) != name
    )
    assert job_name({"batch": BATCH, "image": {"tag": "1.2.3"}}) != name
    # ... and so is the same run asked for again, under a new runId.
    rerun = job_name({"batch": BATCH | {"runId": "2026-12-01"}})
    assert rerun != name
    assert job_name({"batch": BATCH | {"runId": "2026-12-01"}}) == rerun
    assert job_name({"batch": BATCH | {"runId": "2026-12-02"}}) not in (name, rerun)


@pytest.mark.parametrize("schedule", ["", "@hourly"])
def test_batch_names_fit_what_kubernetes_allows(chart: helm.Chart, schedule: str) -> None:
    # A CronJob's name leaves room for its Jobs' 11-character suffix.
    values = tagged({"batch": BATCH | {"schedule": schedule}})
    docs = render(chart, values, name="a-very-long-release-name-for-a-sentence-embedding-service")
    (doc,) = [d for d in docs if d["kind"] in ("Job", "CronJob")]
    assert len(doc["metadata"]["name"]) <= 52


def test_batch_example_is_a_nightly_cronjob_of_four_shards_writing_to_a_volume(
    chart: helm.Chart,
) -> None:
    docs = render(chart, VALUE_SETS["values-batch"])
    cronjob = find(docs, "CronJob", "batch")
    assert cronjob["spec"]["schedule"] == "0 2 * * *"
    spec = batch_job(docs)
    assert (spec["completions"], spec["parallelism"]) == (4, 4)
    (batch,) = spec["template"]["spec"]["containers"]
    assert batch["args"][-2:] == ["--shards", "4"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in spec["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    mounts = {m["name"]: m["mountPath"] for m in batch["volumeMounts"]}
    output = batch["args"][batch["args"].index("--output") + 1]
    assert any(output.startswith(mounts[name] + "/") for name in claims)


def test_the_batch_command_takes_the_flags_the_chart_passes() -> None:
    if "batch" not in serving_core_commands():
        pytest.skip(PENDING_COMMANDS["batch"])
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        serving_core_main(["batch", "--help"])
    for flag in ("--input", "--output", "--shards"):
        assert flag in help_text.getvalue(), flag


# --- the job worker: `serving-core worker` as a Deployment, scaled by KEDA --------


def with_worker(values: dict[str, Any] | None = None, **worker: Any) -> dict[str, Any]:
    """``values`` with the worker on, over the shared Redis queue it needs, and a tag."""
    values = tagged(values or {})
    values.setdefault("serving", {}).setdefault("jobsUrl", QUEUE_URL)
    values["worker"] = {"enabled": True, **values.get("worker", {}), **worker}
    return values


def worker_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = find(docs, "Deployment", "worker")["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def test_worker_is_off_by_default_and_so_are_jobs(chart: helm.Chart) -> None:
    docs = render(chart, tagged({}))
    assert not [
        d for d in docs if d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    ]
    assert env_of(containers(find(docs, "Deployment"))["app"])["SERVING_JOBS_ENABLED"] == "false"


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_worker_deployment_renders_valid_and_runs_serving_core_worker(
    chart: helm.Chart, kube_version: str
) -> None:
    docs = render(chart, VALUE_SETS["values-worker"])
    validate(docs, kube_version)
    deployment = find(docs, "Deployment", "worker")
    assert deployment["metadata"]["name"] == "demo-serving-core-worker"
    pod = deployment["spec"]["template"]
    # No nginx: nothing but the kubelet and Prometheus calls it.
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker"]
    container = worker_container(docs)
    assert container["command"] == ["serving-core", "worker"]
    assert container["image"] == containers(find(docs, "Deployment"))["app"]["image"]
    # Its own pods: no server Service, budget or policy selects them.
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "worker"
    for service in (d for d in docs if d["kind"] == "Service"):
        selects = service["spec"]["selector"].items() <= labels.items()
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        assert selects == (component == "worker-metrics"), service["metadata"]["name"]


def test_worker_env_is_the_servers_with_its_own_bind(chart: helm.Chart) -> None:
    serving = {
        "handler": "handlers/other/handler.py",
        "device": "cuda",
        "dtype": "float16",
        "jobsUrlSecret": JOBS_SECRET,
        "jobsUrl": "",
    }
    docs = render(chart, with_worker({"serving": serving}))
    app, worker = containers(find(docs, "Deployment"))["app"], worker_container(docs)
    assert [e for e in worker["env"] if e["name"] != "SERVING_BIND"] == [
        e for e in app["env"] if e["name"] != "SERVING_BIND"
    ]
    (url,) = [e for e in worker["env"] if e["name"] == "SERVING_JOBS_URL"]
    assert url["valueFrom"]["secretKeyRef"] == JOBS_SECRET
    settings = Settings.from_env(serving_env(worker), cores=2)
    # TCP: `serving-core worker` refuses a unix: bind, and the kubelet probes this port.
    assert settings.bind == "0.0.0.0:9090"
    assert settings.handler == "handlers/other/handler.py"
    assert settings.jobs_url.startswith("redis://")
    assert worker["securityContext"] == app["securityContext"]
    assert worker["resources"] == app["resources"]


def test_worker_probes_ask_its_own_port(chart: helm.Chart) -> None:
    docs = render(chart, with_worker(port=9191))
    worker = worker_container(docs)
    assert worker["ports"] == [{"name": "metrics", "containerPort": 9191, "protocol": "TCP"}]
    assert env_of(worker)["SERVING_BIND"] == "0.0.0.0:9191"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert worker[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    # The handler loads before the port opens: minutes, as for the server.
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert worker["livenessProbe"]["periodSeconds"] == 10


@pytest.mark.parametrize(
    ("serving_workers", "worker_workers", "expected"),
    [(0, 0, None), (5, 0, "5"), (5, 2, "2"), (0, 3, "3")],
)
def test_worker_processes_default_to_the_servers(
    chart: helm.Chart, serving_workers: int, worker_workers: int, expected: str | None
) -> None:
    values = with_worker({"serving": {"workers": serving_workers}}, workers=worker_workers)
    assert env_of(worker_container(render(chart, values))).get("SERVING_WORKERS") == expected


def test_worker_resources_override_the_servers(chart: helm.Chart) -> None:
    resources = {"requests": {"cpu": "8", "memory": "4Gi"}, "limits": {"cpu": "8", "memory": "6Gi"}}
    assert worker_container(render(chart, with_worker(resources=resources)))["resources"] == (
        resources
    )


def test_worker_grace_period_covers_the_batch_in_hand(chart: helm.Chart) -> None:
    def grace(values: dict[str, Any]) -> int:
        deployment = find(render(chart, values), "Deployment", "worker")
        return deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]  # type: ignore[no-any-return]

    assert grace(with_worker({"serving": {"gracefulTimeoutSeconds": 20.5}})) == 21 + 5
    assert grace(with_worker(terminationGracePeriodSeconds=120)) == 120


def test_without_keda_the_worker_replica_count_applies(chart: helm.Chart) -> None:
    docs = render(chart, with_worker(replicaCount=3))
    assert find(docs, "Deployment", "worker")["spec"]["replicas"] == 3
    assert "ScaledObject" not in {d["kind"] for d in docs}


@pytest.mark.parametrize(
    ("worker_enabled", "jobs_enabled", "expected"),
    [(False, None, "false"), (True, None, "true"), (True, False, "false"), (False, True, "true")],
)
def test_post_jobs_follows_the_worker_unless_set(
    chart: helm.Chart, worker_enabled: bool, jobs_enabled: bool | None, expected: str
) -> None:
    values = with_worker() if worker_enabled else tagged({"serving": {"jobsUrl": QUEUE_URL}})
    if jobs_enabled is not None:
        values["serving"]["jobsEnabled"] = jobs_enabled
    app = containers(find(render(chart, values), "Deployment"))["app"]
    assert env_of(app)["SERVING_JOBS_ENABLED"] == expected
    assert Settings.from_env(serving_env(app), cores=2).jobs_enabled is (expected == "true")


def test_worker_metrics_have_their_own_service_and_service_monitor(chart: helm.Chart) -> None:
    values = with_worker({"metrics": {"serviceMonitor": {"enabled": True}}}, port=9191)
    docs = render(chart, values)
    deployment = find(docs, "Deployment", "worker")
    service = find(docs, "Service", "worker-metrics")
    assert service["metadata"]["name"] == "demo-serving-core-worker-metrics"
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9191, "targetPort": "metrics", "protocol": "TCP"}
    ]
    monitor = find(docs, "ServiceMonitor", "worker")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    # The server's ServiceMonitor still selects the server's metrics Service only.
    server_selector = find(docs, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert not server_selector.items() <= service["metadata"]["labels"].items()


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_worker_pods_take_the_pod_knobs_and_the_network_policy(
    chart: helm.Chart, kube_version: str
) -> None:
    values = with_worker(
        POD_KNOBS | {"networkPolicy": {"enabled": True, "metricsFrom": [MONITORING]}}
    )
    docs = render(chart, values)
    validate(docs, kube_version)
    deployment = find(docs, "Deployment", "worker")
    pod = deployment["spec"]["template"]
    for key in ("nodeSelector", "tolerations", "affinity", "runtimeClassName", "priorityClassName"):
        assert pod["spec"][key] == POD_KNOBS[key], key
    assert pod["metadata"]["annotations"] == POD_KNOBS["podAnnotations"]
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    worker = worker_container(docs)
    assert worker["env"][-2:] == POD_KNOBS["extraEnv"]
    assert POD_KNOBS["extraVolumes"][0] in pod["spec"]["volumes"]
    assert POD_KNOBS["extraVolumeMounts"][0] in worker["volumeMounts"]
    policy = find(docs, "NetworkPolicy", "worker")
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [MONITORING]}
    ]


def test_worker_writes_only_to_emptydirs(chart: helm.Chart) -> None:
    docs = render(chart, with_worker())
    pod = find(docs, "Deployment", "worker")["spec"]["template"]["spec"]
    worker = worker_container(docs)
    assert worker["securityContext"]["readOnlyRootFilesystem"] is True
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    writable = {m["mountPath"] for m in worker["volumeMounts"] if m["name"] in empty_dirs}
    assert writable == {"/tmp", env_of(worker)["SERVING_METRICS_DIR"]}


def test_worker_names_fit_what_kubernetes_allows(chart: helm.Chart) -> None:
    values = with_worker(queue="minilm", keda={"enabled": True})
    docs = render(chart, values, name="a-very-long-release-name-for-a-sentence-embedding-service")
    worker_parts = ("worker", "worker-metrics")
    names = [
        d["metadata"]["name"]
        for d in docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component") in worker_parts
    ]
    assert len(names) == 3
    assert all(len(name) <= 63 for name in names), names


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


def test_the_worker_command_and_its_health_routes_exist() -> None:
    assert "worker" in serving_core_commands()
    consumer = (ROOT / "serving_core" / "process" / "prefork.py").read_text()
    assert '"/healthz"' in consumer
    assert '"/metrics"' in consumer


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


# --- the Grafana dashboard ConfigMap and the PrometheusRule ----------------------


def monitoring_values(**rule: Any) -> dict[str, Any]:
    return tagged(
        {
            "serving": {"requestTimeoutSeconds": 4},
            "metrics": {
                "grafanaDashboard": {"enabled": True},
                "prometheusRule": {"enabled": True, "labels": {"release": "kps"}, **rule},
            },
        }
    )


def test_dashboard_and_alerts_are_off_by_default(chart: helm.Chart) -> None:
    kinds = {d["kind"] for d in render(chart, tagged({}))}
    assert "PrometheusRule" not in kinds
    assert "ConfigMap" not in kinds or all(
        "grafana_dashboard" not in d["metadata"]["labels"]
        for d in render(chart, tagged({}))
        if d["kind"] == "ConfigMap"
    )


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar(
    chart: helm.Chart, kube_version: str
) -> None:
    assert lint_errors(monitoring_values(), kube_version) == []
    docs = render(chart, monitoring_values())
    (configmap,) = [
        d for d in docs if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    ]
    kubernetes_validate.validate(configmap, kube_version, strict=True)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = CHART / "dashboards" / "serving-core.json"
    assert json.loads(configmap["data"]["serving-core.json"]) == json.loads(dashboard.read_text())
    # deploy/grafana's file is this one (a link), so the two cannot drift.
    assert (ROOT / "deploy/grafana/serving-core.json").resolve() == dashboard.resolve()


def test_prometheus_rule_has_the_alerts_of_deploy_with_the_releases_deadline(
    chart: helm.Chart,
) -> None:
    from tests.deploy.test_dashboard import PROMETHEUS_RULE_SCHEMA, RULES, metric_names, rule_exprs

    docs = render(chart, monitoring_values(errorRatio=0.02))
    rule = (
        find(docs, "PrometheusRule")
        if False
        else next(d for d in docs if d["kind"] == "PrometheusRule")
    )
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    assert rule["metadata"]["labels"]["release"] == "kps"
    standalone = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(alerts) == {r["alert"] for g in standalone["spec"]["groups"] for r in g["rules"]}
    for expr in rule_exprs(rule):
        assert 'namespace="serving"' in expr
        # The same metrics as the standalone rules, which a real server exports.
        assert metric_names(expr) <= set().union(*map(metric_names, rule_exprs(standalone)))
    assert alerts["ServingCoreP99OverDeadline"]["expr"].rstrip().endswith("> 4")
    assert alerts["ServingCoreHigh5xxRate"]["expr"].rstrip().endswith("> 0.02")
    assert "{{ $labels.job }}" in alerts["ServingCoreSustained503"]["annotations"]["description"]


@pytest.mark.parametrize(
    "values",
    [
        {"metrics": {"prometheusRule": {"errorRatio": 2}}},
        {"metrics": {"prometheusRule": {"severity": "page"}}},
        {"metrics": {"grafanaDashboard": {"folder": "x"}}},
    ],
)
def test_monitoring_values_outside_the_schema_are_refused(
    chart: helm.Chart, values: dict[str, Any]
) -> None:
    with pytest.raises(Exception, match=r"(?i)schema|additional|maximum"):
        render(chart, tagged(values))


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
