"""The health checks: the kubelet's probes of the app and of nginx, and the pod
`helm test` runs against the release."""

from __future__ import annotations

import copy
import http.server
import subprocess
import threading
from typing import Any

import helm_python as helm
import pytest

from tests.deploy.chart import (
    KUBE_VERSIONS,
    POD_KNOBS,
    VALUE_SETS,
    containers,
    find,
    pod_spec,
    render,
    tagged,
    validate,
)

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
