"""The job worker: `serving-core worker` as a Deployment of its own."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from serving_core.settings import Settings
from tests.deploy.chart import (
    JOBS_SECRET,
    KUBE_VERSIONS,
    MONITORING,
    POD_KNOBS,
    QUEUE_URL,
    ROOT,
    VALUE_SETS,
    containers,
    env_of,
    find,
    render,
    serving_core_commands,
    serving_env,
    tagged,
    validate,
    with_worker,
    worker_container,
)

# --- the job worker: `serving-core worker` as a Deployment, scaled by KEDA --------


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


def test_the_worker_command_and_its_health_routes_exist() -> None:
    assert "worker" in serving_core_commands()
    # The masters' health server (process/health.py since issue 42's L7).
    consumer = (ROOT / "serving_core" / "process" / "health.py").read_text()
    assert '"/healthz"' in consumer
    assert '"/metrics"' in consumer
