"""What the chart keeps closed: non-root, read-only pods with no capabilities, the
API keys mounted from a Secret into the app container only, and the NetworkPolicy
in front of the API and the metrics port."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest

from tests.deploy.chart import (
    KUBE_VERSIONS,
    MONITORING,
    ROOT,
    VALUE_SETS,
    containers,
    env_of,
    find,
    pod_spec,
    pod_specs,
    render,
    tagged,
    validate,
)


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


# --- NetworkPolicy ---------------------------------------------------------------


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
