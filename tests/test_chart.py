"""The Helm chart, checked with the real tools that run without a cluster.

Helm's own Go SDK (helm_python) lints and renders the chart exactly as
`helm install` would; every manifest is validated against Kubernetes' JSON
schemas (strict: unknown fields fail) for the oldest and newest versions we
support; the rendered nginx configuration runs in front of a real gunicorn.
"""

from __future__ import annotations

import copy
import hashlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import requests
import yaml

from serving_core.settings import Settings
from tests.servers import free_port, gunicorn_server

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "serving-core"
EXAMPLES = sorted((CHART / "examples").glob("values-*.yaml"))
KUBE_VERSIONS = ["1.29", "1.33"]
# Custom resources: not in Kubernetes' schemas, checked field by field below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
PLACEHOLDERS_ON: dict[str, Any] = {
    "serving": {"redisUrl": "redis://redis:6379/0", "cacheUrl": "redis://redis:6379/1"},
    "worker": {"enabled": True, "resources": {"limits": {"memory": "2Gi"}}},
    "batch": {"enabled": True},
}
# Every set of values the chart must take: its defaults, each example, and the
# placeholders of later releases switched on.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "chart-defaults": {},
    **{path.stem: yaml.safe_load(path.read_text()) for path in EXAMPLES},
    "placeholders-on": PLACEHOLDERS_ON,
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


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def nginx_conf(docs: list[dict[str, Any]]) -> str:
    return str(find(docs, "ConfigMap")["data"]["nginx.conf"])


def leaves(values: Any) -> int:
    if isinstance(values, dict):
        return sum(leaves(v) for v in values.values())
    return 1


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
    assert {"Deployment", "Service", "ConfigMap", "Pod"} <= {d["kind"] for d in docs}
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, kube_version, strict=True)


def test_examples_cover_default_custom_handler_and_everything() -> None:
    assert {p.stem for p in EXAMPLES} >= {
        "values-default",
        "values-custom-handler",
        "values-full",
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
        "ConfigMap",
        "Pod",
    }


def test_service_monitor_scrapes_the_metrics_port_of_the_service(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-full"])
    monitor = find(docs, "ServiceMonitor")
    service = find(docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
        "scrapeTimeout": "5s",
    }
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}


# --- settings: camelCase values -> SERVING_* env -> serving-core's Settings ------

SETTINGS_TABLE = [
    # value key, value, env var, as the env carries it
    ("handler", "handlers/echo/handler.py", "SERVING_HANDLER", "handlers/echo/handler.py"),
    ("workers", 3, "SERVING_WORKERS", "3"),
    ("workerClass", "gthread", "SERVING_WORKER_CLASS", "gthread"),
    ("workerConnections", 250, "SERVING_WORKER_CONNECTIONS", "250"),
    ("threads", 48, "SERVING_THREADS", "48"),
    ("maxBatchSize", 24, "SERVING_MAX_BATCH_SIZE", "24"),
    ("maxWaitMs", 2.5, "SERVING_MAX_WAIT_MS", "2.5"),
    ("batchPolicy", "fixed", "SERVING_BATCH_POLICY", "fixed"),
    ("maxQueue", 1000000, "SERVING_MAX_QUEUE", "1000000"),
    ("requestTimeoutSeconds", 0.5, "SERVING_REQUEST_TIMEOUT_S", "0.5"),
    ("maxBodyBytes", 4194304, "SERVING_MAX_BODY_BYTES", "4194304"),
    ("gracefulTimeoutSeconds", 45, "SERVING_GRACEFUL_TIMEOUT_S", "45"),
    ("keepaliveSeconds", 2, "SERVING_KEEPALIVE_S", "2"),
    ("logLevel", "debug", "SERVING_LOG_LEVEL", "debug"),
    ("cacheUrl", "redis://cache:6379/0", "SERVING_CACHE_URL", "redis://cache:6379/0"),
    ("redisUrl", "redis://jobs:6379/0", "SERVING_REDIS_URL", "redis://jobs:6379/0"),
]


@pytest.mark.parametrize(("key", "value", "env", "expected"), SETTINGS_TABLE)
def test_each_serving_value_sets_its_env_var(
    chart: helm.Chart, key: str, value: Any, env: str, expected: str
) -> None:
    app = containers(find(render(chart, {"serving": {key: value}}), "Deployment"))["app"]
    assert env_of(app)[env] == expected


def test_settings_table_covers_every_serving_value(chart: helm.Chart) -> None:
    assert {row[0] for row in SETTINGS_TABLE} == set(chart.values["serving"])


def test_rendered_env_is_what_serving_core_accepts(chart: helm.Chart) -> None:
    values = {"serving": {row[0]: row[1] for row in SETTINGS_TABLE[:14]}}
    env = env_of(containers(find(render(chart, values), "Deployment"))["app"])
    serving_env = {k: v for k, v in env.items() if k.startswith("SERVING_")}
    settings = Settings.from_env(serving_env, cores=2)
    assert settings.workers == 3
    assert settings.worker_class == "gthread"
    assert settings.worker_connections == 250
    assert settings.threads == 48
    assert settings.max_wait_ms == 2.5
    assert settings.max_queue == 1000000
    assert settings.request_timeout_s == 0.5
    assert settings.max_body_bytes == 4194304
    assert settings.bind == "unix:/run/serving/gunicorn.sock"
    assert settings.metrics_dir == "/run/metrics"


@pytest.mark.parametrize("values_name", [n for n in VALUE_SETS if n != "placeholders-on"])
def test_every_example_starts_serving_core_without_a_settings_error(
    chart: helm.Chart, values_name: str
) -> None:
    env = env_of(containers(find(render(chart, VALUE_SETS[values_name]), "Deployment"))["app"])
    Settings.from_env({k: v for k, v in env.items() if k.startswith("SERVING_")}, cores=2)


def test_workers_and_threads_are_left_to_serving_core_by_default(chart: helm.Chart) -> None:
    env = env_of(containers(find(render(chart, {}), "Deployment"))["app"])
    assert "SERVING_WORKERS" not in env
    assert "SERVING_THREADS" not in env
    assert "SERVING_CACHE_URL" not in env
    assert "SERVING_REDIS_URL" not in env


def test_extra_env_and_env_from_reach_the_app(chart: helm.Chart) -> None:
    app = containers(find(render(chart, VALUE_SETS["values-full"]), "Deployment"))["app"]
    by_name = {e["name"]: e for e in app["env"]}
    assert by_name["MODEL_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "model-secrets",
        "key": "token",
    }
    assert app["envFrom"] == [{"secretRef": {"name": "model-settings", "optional": True}}]


# --- the pod: probes, drain, security, the nginx sidecar --------------------------


def test_probes_check_readyz_and_healthz_through_nginx(chart: helm.Chart) -> None:
    deployment = find(render(chart, {"nginx": {"port": 8181}}), "Deployment")
    app = containers(deployment)["app"]
    assert app["startupProbe"]["httpGet"] == {"path": "/readyz", "port": 8181}
    assert app["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8181}
    assert app["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8181}
    assert containers(deployment)["nginx"]["ports"][0]["containerPort"] == 8181
    startup = app["startupProbe"]
    # Sized for model loading: minutes, not the kubelet's default seconds.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


def test_probe_timing_comes_from_values(chart: helm.Chart) -> None:
    app = containers(find(render(chart, VALUE_SETS["values-full"]), "Deployment"))["app"]
    assert app["startupProbe"]["failureThreshold"] == 90
    assert app["livenessProbe"]["periodSeconds"] == 15


def test_prestop_pause_and_grace_period_cover_the_drain(chart: helm.Chart) -> None:
    values = {"lifecycle": {"preStopSleepSeconds": 7}, "serving": {"gracefulTimeoutSeconds": 20.5}}
    pod = find(render(chart, values), "Deployment")["spec"]["template"]["spec"]
    for container in pod["containers"]:
        assert container["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "7"]}}
    assert pod["terminationGracePeriodSeconds"] == 7 + 21 + 5


def test_an_explicit_grace_period_wins(chart: helm.Chart) -> None:
    pod = find(render(chart, VALUE_SETS["values-full"]), "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 90


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_pod_is_non_root_read_only_and_drops_capabilities(
    chart: helm.Chart, values_name: str
) -> None:
    docs = render(chart, VALUE_SETS[values_name])
    pods = [d["spec"] for d in docs if d["kind"] == "Pod"]
    pods += [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    pods += [
        d["spec"]["jobTemplate"]["spec"]["template"]["spec"] for d in docs if d["kind"] == "CronJob"
    ]
    assert pods
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


def test_writable_paths_are_emptydirs(chart: helm.Chart) -> None:
    docs = render(chart, {})
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
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
    # Everything nginx writes (pid, temp files) is under one of its emptyDirs.
    conf = nginx_conf(docs)
    nginx_paths = re.findall(r"^\s*(?:pid|\w+_temp_path) (\S+);", conf, re.MULTILINE)
    assert len(nginx_paths) == 6
    nginx_dirs = writable(by_name["nginx"])
    for path in nginx_paths:
        assert any(path.startswith(d + "/") for d in nginx_dirs), path
    # The socket directory is the same emptyDir in both containers.
    mounts = {c: {m["mountPath"]: m["name"] for m in by_name[c]["volumeMounts"]} for c in by_name}
    assert mounts["app"][socket_dir] == mounts["nginx"][socket_dir]


def test_nginx_sidecar_proxies_to_the_app_socket(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-custom-handler"])
    deployment = find(docs, "Deployment")
    by_name = containers(deployment)
    assert list(by_name) == ["app", "nginx"]
    assert by_name["nginx"]["image"] == "ghcr.io/acme/sentiment-nginx:1.4.0"
    config_volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "nginx-config"
    )
    assert config_volume["configMap"]["name"] == find(docs, "ConfigMap")["metadata"]["name"]
    conf_path = by_name["nginx"]["args"][by_name["nginx"]["args"].index("-c") + 1]
    config_mount = next(m for m in by_name["nginx"]["volumeMounts"] if m["name"] == "nginx-config")
    assert conf_path == config_mount["mountPath"] + "/nginx.conf"
    bind = env_of(by_name["app"])["SERVING_BIND"]
    assert f"server {bind};" in nginx_conf(docs)


def test_nginx_limits_follow_the_serving_values(chart: helm.Chart) -> None:
    values = {
        "serving": {"maxBodyBytes": 4194304, "requestTimeoutSeconds": 2.5, "keepaliveSeconds": 10}
    }
    conf = nginx_conf(render(chart, values))
    assert "client_max_body_size 4194304;" in conf
    assert "proxy_read_timeout 7500ms;" in conf
    assert "proxy_send_timeout 7500ms;" in conf
    # Idle upstream connections close before gunicorn's keep-alive does.
    assert "keepalive_timeout 9000ms;" in conf
    assert "proxy_set_header X-Request-ID $serving_request_id;" in conf
    # The app's deadline counts from nginx's hand-off.
    assert 'proxy_set_header X-Request-Start "t=$msec";' in conf


def test_nginx_keeps_no_idle_upstream_connections_when_gunicorn_has_no_keepalive(
    chart: helm.Chart,
) -> None:
    conf = nginx_conf(render(chart, {"serving": {"keepaliveSeconds": 0}}))
    upstream = conf[conf.index("upstream serving_core") :].split("}", 1)[0]
    assert "keepalive" not in upstream


def test_a_changed_nginx_config_rolls_the_pods(chart: helm.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        pod = find(render(chart, values), "Deployment")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/nginx-config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"serving": {"maxBodyBytes": 2048}})


def test_images_default_to_the_chart_app_version(chart: helm.Chart) -> None:
    by_name = containers(find(render(chart, {}), "Deployment"))
    version = chart.metadata["appVersion"]
    assert by_name["app"]["image"] == f"ghcr.io/your-org/serving-core:{version}"
    assert by_name["nginx"]["image"] == f"ghcr.io/your-org/serving-core-nginx:{version}"


def test_a_digest_pins_the_images(chart: helm.Chart) -> None:
    digest = "sha256:" + hashlib.sha256(b"image").hexdigest()
    values = {"image": {"tag": "1.0.0", "digest": digest}, "nginx": {"image": {"digest": digest}}}
    by_name = containers(find(render(chart, values), "Deployment"))
    assert by_name["app"]["image"] == f"ghcr.io/your-org/serving-core:1.0.0@{digest}"
    assert by_name["nginx"]["image"] == f"ghcr.io/your-org/serving-core-nginx:1.0.0@{digest}"


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
    hpa = find(render(chart, {"autoscaling": {"enabled": True}}), "HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource"]


def test_without_autoscaling_replica_count_applies(chart: helm.Chart) -> None:
    docs = render(chart, {"replicaCount": 4})
    assert find(docs, "Deployment")["spec"]["replicas"] == 4
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]


def test_service_and_disruption_budget_select_only_server_pods(chart: helm.Chart) -> None:
    docs = render(chart, PLACEHOLDERS_ON)
    server = find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    worker = find(docs, "Deployment", "worker")["spec"]["template"]["metadata"]["labels"]
    for selector in (
        find(docs, "Service")["spec"]["selector"],
        find(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= server.items()
        assert not selector.items() <= worker.items()


def test_helm_test_hook_calls_readyz_through_the_service(chart: helm.Chart) -> None:
    docs = render(chart, {})
    pod = next(d for d in docs if d["kind"] == "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = find(docs, "Service")
    url = pod["spec"]["containers"][0]["command"][-1]
    assert url == f"http://{service['metadata']['name']}.serving.svc:80/readyz"


def test_placeholders_are_off_by_default(chart: helm.Chart) -> None:
    docs = render(chart, {})
    kinds = [(d["kind"], d["metadata"]["labels"].get("app.kubernetes.io/component")) for d in docs]
    assert ("Deployment", "worker") not in kinds
    assert ("CronJob", "batch") not in kinds


def test_placeholders_share_the_serving_settings(chart: helm.Chart) -> None:
    docs = render(chart, PLACEHOLDERS_ON)
    worker = find(docs, "Deployment", "worker")["spec"]["template"]["spec"]["containers"][0]
    batch = find(docs, "CronJob", "batch")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert worker["command"] == ["serving-core", "worker"]
    assert batch["containers"][0]["command"] == ["serving-core", "batch"]
    assert env_of(worker)["SERVING_REDIS_URL"] == "redis://redis:6379/0"
    assert env_of(batch["containers"][0])["SERVING_CACHE_URL"] == "redis://redis:6379/1"


# --- bad values are refused with a readable message ----------------------------

BAD_VALUES = [
    ({"replicaCount": "three"}, "at '/replicaCount': got string, want integer"),
    ({"serving": {"maxBatchSize": "16"}}, "at '/serving/maxBatchSize': got string, want integer"),
    ({"serving": {"requestTimeoutSeconds": 0}}, "at '/serving/requestTimeoutSeconds'"),
    ({"serving": {"batchPolicy": "greedy"}}, "at '/serving/batchPolicy'"),
    ({"autoscaling": {"enabled": "yes"}}, "at '/autoscaling/enabled': got string, want boolean"),
    ({"replicas": 3}, "additional properties 'replicas' not allowed"),
    (
        {"serving": {"maxBatchsize": 8}},
        "at '/serving': additional properties 'maxBatchsize' not allowed",
    ),
    ({"nginx": {"image": {"tag": 1.25}}}, "at '/nginx/image/tag': got number, want string"),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES)
def test_schema_refuses_bad_values_naming_the_key(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(values, name="demo", namespace="serving")
    assert "values don't meet the specifications of the schema" in str(refused.value)
    assert message in str(refused.value)
    assert any(message in error for error in lint_errors(values))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda v: v["serving"].update(maxBatchSize="32"),
            "at '/serving/maxBatchSize': got string, want integer",
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


TEMPLATE_REFUSALS = [
    (
        {"serving": {"maxQueue": 8, "maxBatchSize": 16}},
        "serving.maxQueue (8) is smaller than serving.maxBatchSize (16)",
    ),
    (
        {"extraEnv": [{"name": "SERVING_MAX_BATCH_SIZE", "value": "8"}]},
        "extraEnv sets SERVING_MAX_BATCH_SIZE, which the chart sets from serving.maxBatchSize",
    ),
    (
        {"extraEnv": [{"name": "SERVING_BIND", "value": "0.0.0.0:8000"}]},
        "extraEnv sets SERVING_BIND, which the chart manages",
    ),
    (
        {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
        "autoscaling.minReplicas (5) is larger than autoscaling.maxReplicas (2)",
    ),
    (
        {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 0}},
        "autoscaling.enabled needs a metric",
    ),
    ({"worker": {"enabled": True}}, "worker.enabled needs serving.redisUrl"),
    ({"nginx": {"metricsPort": 8080}}, "nginx.port and nginx.metricsPort are both 8080"),
]


@pytest.mark.parametrize(("values", "message"), TEMPLATE_REFUSALS)
def test_rules_beyond_the_schema_stop_the_render_saying_what_to_change(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(values, name="demo", namespace="serving")


# --- documentation ---------------------------------------------------------------


def test_custom_handler_example_sets_at_most_five_values() -> None:
    assert leaves(VALUE_SETS["values-custom-handler"]) <= 5


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


def test_readme_settings_table_matches_the_chart() -> None:
    readme = (CHART / "README.md").read_text()
    rows = dict(re.findall(r"^\| `serving\.(\w+)` \| `(SERVING_\w+)` \|", readme, re.MULTILINE))
    assert rows == {key: env for key, _, env, _ in SETTINGS_TABLE}


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


# Kubernetes objects the schema only partly describes (EnvVar, TopologySpreadConstraint).
OPEN_OBJECTS = {"extraEnv[]", "topologySpreadConstraints[]"}


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

    assert chart.schema is not None
    walk(chart.schema, "")
    assert open_objects == []


def test_schema_and_values_yaml_have_the_same_keys(chart: helm.Chart) -> None:
    schema = chart.schema
    assert schema is not None
    assert set(schema["properties"]) - {"global"} == set(chart.values)
    assert schema["additionalProperties"] is False


# --- the rendered nginx config runs ---------------------------------------------


def runnable_nginx_conf(conf: str, tmp: Path, ports: tuple[int, int]) -> Path:
    """The pod's nginx.conf with its pod paths moved under ``tmp`` and listening on 127.0.0.1."""
    conf = conf.replace("/tmp/nginx/", f"{tmp}/nginx/")
    conf = conf.replace("unix:/run/serving/", f"unix:{tmp}/")
    for port in ports:
        conf = conf.replace(f"listen {port};", f"listen 127.0.0.1:{port};")
    (tmp / "nginx").mkdir()
    path = tmp / "nginx.conf"
    path.write_text(conf)
    return path


def nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if not found:
        pytest.fail("nginx is not installed; `make system-deps` installs it")
    return found


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_rendered_nginx_config_passes_nginx_t(chart: helm.Chart, values_name: str) -> None:
    nginx = nginx_binary()
    values = copy.deepcopy(VALUE_SETS[values_name])
    docs = render(chart, values)
    ports = tuple(
        p["containerPort"] for p in containers(find(docs, "Deployment"))["nginx"]["ports"]
    )
    with tempfile.TemporaryDirectory() as tmp:
        conf = runnable_nginx_conf(nginx_conf(docs), Path(tmp), ports)
        result = subprocess.run(
            [nginx, "-t", "-c", str(conf), "-e", "stderr"],
            capture_output=True,
            text=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr


@pytest.mark.e2e
def test_rendered_nginx_fronts_gunicorn_over_the_unix_socket(chart: helm.Chart) -> None:
    nginx = nginx_binary()
    api_port, metrics_port = free_port(), free_port()
    values = {
        "nginx": {"port": api_port, "metricsPort": metrics_port},
        "serving": {"maxBodyBytes": 2000},
    }
    docs = render(chart, values)
    env = env_of(containers(find(docs, "Deployment"))["app"])
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # Under root, nginx's workers run as nobody: let them reach the socket.
        tmp.chmod(0o755)
        conf = runnable_nginx_conf(nginx_conf(docs), tmp, (api_port, metrics_port))
        overrides = {
            "SERVING_HANDLER": "handlers/echo/handler.py",
            "SERVING_WORKERS": "1",
            "SERVING_MAX_BODY_BYTES": env["SERVING_MAX_BODY_BYTES"],
            "SERVING_BIND": env["SERVING_BIND"].replace("/run/serving/", f"{tmp}/"),
        }
        with gunicorn_server(overrides) as server, open(tmp / "nginx.log", "wb") as log:
            proxy = subprocess.Popen(
                [nginx, "-c", str(conf), "-e", "stderr", "-g", "daemon off;"],
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
                assert "request_id=chart-e2e-1" in server.output()

                too_big = requests.post(
                    f"{api}/predict",
                    data=b"x" * 3000,
                    headers={"Content-Type": "application/json"},
                    timeout=5,
                )
                assert too_big.status_code == 413
                assert too_big.json()["error"]["type"] == "payload_too_large"
                assert too_big.headers["X-Request-ID"]

                hidden = requests.get(f"{api}/metrics", timeout=5)
                assert hidden.status_code == 404
                assert hidden.json()["error"]["type"] == "not_found"
                assert "GET /metrics" not in server.output()
                requests.get(f"{metrics}/metrics", timeout=5)
                assert "GET /metrics" in server.output()
            finally:
                proxy.terminate()
                proxy.wait(10)


def wait_for(url: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    pytest.fail(f"{url} did not answer within {timeout_s} s")
