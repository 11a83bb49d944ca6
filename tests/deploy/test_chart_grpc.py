"""gRPC: the app's front, nginx's h2c listener and the Service's grpc port."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest

from serving_core.settings import Settings
from tests.deploy.chart import (
    containers,
    env_of,
    find,
    render,
    serving_env,
    tagged,
)
from tests.nginx_server import NGINX, nginx_t
from tests.nginx_server import render as render_nginx

# --- gRPC: the app's front, nginx's h2c listener, the Service's grpc port ---------

GRPC_ON = {"grpc": {"enabled": True}}  # on the default worker class (issue 42)


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
    off = containers(find(render(chart, tagged({})), "Deployment"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert pod["app"][probe] == off["app"][probe]
        assert pod["nginx"].get(probe) == off["nginx"].get(probe)


@pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is not installed (make system-deps)")
def test_grpc_sidecar_env_renders_a_config_nginx_accepts(chart: helm.Chart, tmp_path: Path) -> None:
    nginx = env_of(containers(find(render(chart, tagged(GRPC_ON)), "Deployment"))["nginx"])
    tested = nginx_t(render_nginx(nginx, tmp_path / "conf"))
    assert tested.returncode == 0, tested.stderr
