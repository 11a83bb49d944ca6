"""The nginx sidecar: the image's own config, rendered from the environment the chart
gives it, accepted by `nginx -t`, then in front of a real gunicorn over the unix
socket."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import requests

from serving_core.cores import usable_cores
from serving_core.settings import Settings
from tests.deploy.chart import (
    VALUE_SETS,
    containers,
    env_of,
    find,
    pod_spec,
    render,
    serving_env,
    tagged,
)
from tests.nginx_server import render as render_nginx
from tests.servers import free_port, gunicorn_server

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
    for name in (
        "SERVING_MAX_BODY_BYTES",
        "SERVING_REQUEST_TIMEOUT_S",
        "SERVING_GENERATION_TIMEOUT_S",
        "SERVING_KEEPALIVE_S",
    ):
        assert nginx[name] == app[name]
    assert (nginx["NGINX_PORT"], nginx["NGINX_METRICS_PORT"]) == ("8080", "9090")


def test_nginx_values_reach_its_environment(chart: helm.Chart) -> None:
    nginx = env_of(
        containers(find(render(chart, VALUE_SETS["values-full"]), "Deployment"))["nginx"]
    )
    assert nginx["NGINX_WORKER_PROCESSES"] == "2"
    assert nginx["NGINX_WORKER_CONNECTIONS"] == "4096"
    assert nginx["NGINX_CONN_LIMIT_PER_CLIENT"] == "64"
    assert nginx["NGINX_BODY_SPOOL_BYTES"] == "512m"
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


@pytest.mark.parametrize(
    ("set_to", "expected"),
    # Half the default tmpSizeLimit (256Mi); a number stays whole (YAML gives Helm a float).
    [(None, "128m"), (134217728, "134217728"), ("1g", "1g"), (0, "0")],
)
def test_nginx_body_spool_size_reaches_its_environment(
    chart: helm.Chart, set_to: int | str | None, expected: str
) -> None:
    # A /tmp that holds the largest (test_chart_spool.py checks the two together).
    values = tagged({"tmpSizeLimit": "2Gi"})
    if set_to is not None:
        values["nginx"] = {"bodySpoolSize": set_to}
    nginx = env_of(containers(find(render(chart, values), "Deployment"))["nginx"])
    assert nginx["NGINX_BODY_SPOOL_BYTES"] == expected


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
