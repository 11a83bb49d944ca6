"""The chart's alerts in a real Prometheus (Debian's prometheus package) that
scrapes a real app through real nginx, and Debian's nginx-prometheus-exporter
over that nginx's stub_status with the flags the chart gives its sidecar, as the
ServiceMonitor does: every rule finds the series it selects and evaluates
without error; ServingCoreAppDown goes pending once gunicorn is gone while nginx
still answers (502) on /metrics, ServingCoreNginxDown once nginx is gone too,
and ServingCoreNginxExporterDown once the exporter is. Before that, how the
chart wires the exporter to nginx, as rendered."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import requests
import yaml

from tests.conftest import PROBE
from tests.deploy.chart import CHART, containers, env_of, find, render, tagged
from tests.deploy.test_alerts import (
    ALERTS,
    JOBS,
    NAMESPACE,
    NGINX_ALERTS,
    NGINX_JOBS,
    RELEASES,
    prometheus_rule,
    rules_of,
)
from tests.deploy.test_dashboard import metric_names
from tests.nginx_server import nginx_server
from tests.servers import free_port, gunicorn_server, stop, wait_for

RELEASE = "iris-setosa"
EXPORTER = "/usr/bin/prometheus-nginx-exporter"  # Debian's build of NGINX Inc's exporter


def rendered(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    return render(chart, tagged(values), name=RELEASE)


def exporter_values(status_port: int = 8082, port: int = 9113) -> dict[str, Any]:
    exporter = {"enabled": True, "statusPort": status_port, "port": port}
    return {
        **RELEASES[RELEASE],
        "nginx": {"exporter": exporter},
        "metrics": {**RELEASES[RELEASE]["metrics"], "serviceMonitor": {"enabled": True}},
        "networkPolicy": {"enabled": True, "metricsFrom": [{"podSelector": {}}]},
    }


def test_the_chart_wires_the_exporter_to_nginxs_status_port_and_scrapes_it_as_its_job() -> None:
    with helm.Chart.load(CHART) as chart:
        docs = rendered(chart, exporter_values(status_port=8090, port=9200))
    pod = containers(find(docs, "Deployment"))
    assert env_of(pod["nginx"])["NGINX_STATUS_PORT"] == "8090"
    exporter = pod["nginx-exporter"]
    assert "--nginx.scrape-uri=http://127.0.0.1:8090/stub_status" in exporter["args"]
    assert exporter["ports"] == [
        {"name": "nginx-metrics", "containerPort": 9200, "protocol": "TCP"}
    ]
    assert exporter["image"] == "docker.io/nginx/nginx-prometheus-exporter:1.5.1"
    service = find(docs, "Service", "metrics")
    assert {
        "name": "nginx-metrics",
        "port": 9200,
        "targetPort": "nginx-metrics",
        "protocol": "TCP",
    } in (service["spec"]["ports"])
    (endpoint,) = [
        e for e in find(docs, "ServiceMonitor")["spec"]["endpoints"] if e["port"] == "nginx-metrics"
    ]
    assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": NGINX_JOBS[RELEASE]}]
    (metrics_rule,) = [r for r in find(docs, "NetworkPolicy")["spec"]["ingress"] if "from" in r]
    assert {"port": "nginx-metrics", "protocol": "TCP"} in metrics_rule["ports"]


def test_without_the_exporter_nginx_serves_no_status_and_nothing_scrapes_it() -> None:
    values = exporter_values()
    values["nginx"]["exporter"]["enabled"] = False
    with helm.Chart.load(CHART) as chart:
        docs = rendered(chart, values)
    pod = containers(find(docs, "Deployment"))
    assert set(pod) == {"app", "nginx"}
    assert "NGINX_STATUS_PORT" not in env_of(pod["nginx"])
    assert [p["name"] for p in find(docs, "Service", "metrics")["spec"]["ports"]] == ["metrics"]
    assert [e["port"] for e in find(docs, "ServiceMonitor")["spec"]["endpoints"]] == ["metrics"]


@pytest.mark.parametrize(
    ("exporter", "message"),
    [
        ({"statusPort": 8080}, "nginx.exporter.statusPort (8080) is also nginx.port"),
        ({"port": 9090}, "nginx.exporter.port (9090) is also nginx.metricsPort"),
        ({"port": 9300, "statusPort": 9300}, "is also nginx.exporter."),
    ],
)
def test_an_exporter_port_another_container_listens_on_is_refused(
    exporter: dict[str, int], message: str
) -> None:
    values = exporter_values()
    values["nginx"]["exporter"].update(exporter)
    with helm.Chart.load(CHART) as chart, pytest.raises(Exception, match=re.escape(message)):
        rendered(chart, values)


@contextlib.contextmanager
def prometheus(targets: dict[str, str], rule: dict[str, Any]) -> Iterator[tuple[str, Path]]:
    """Prometheus scraping each of ``targets`` (job: URL) every second, with
    ``rule``'s groups loaded; yields its URL and its log."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail("prometheus is not installed; `make system-deps` installs Debian's prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [
                    {
                        "targets": [url.removeprefix("http://")],
                        "labels": {"namespace": NAMESPACE},
                    }
                ],
            }
            for job, url in targets.items()
        ],
    }
    with tempfile.TemporaryDirectory(prefix="serving-prometheus-") as tmp:
        root = Path(tmp)
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        (root / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        url = f"http://127.0.0.1:{free_port()}"
        command = [
            found,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}",
        ]
        with (root / "prometheus.log").open("wb") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            yield url, root / "prometheus.log"
        finally:
            stop(process)


def query(url: str, expr: str) -> list[dict[str, Any]]:
    with contextlib.suppress(requests.RequestException):
        answer = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5)
        if answer.status_code == 200:
            return answer.json()["data"]["result"]  # type: ignore[no-any-return]
    return []


def value(url: str, expr: str) -> float | None:
    """The one sample ``expr`` selects now, or None when there is none (yet)."""
    found = query(url, expr)
    return float(found[0]["value"][1]) if found else None


def rules_state(url: str) -> dict[str, dict[str, Any]]:
    with contextlib.suppress(requests.RequestException):
        groups = requests.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        return {r["name"]: r for group in groups for r in group["rules"]}
    return {}


def evaluated_rules(url: str) -> dict[str, dict[str, Any]]:
    """The rules' states once each has been evaluated (Prometheus reports the
    zero time before that), else an empty dict."""
    state = rules_state(url)
    if not state or any(r["lastEvaluation"].startswith("0001-") for r in state.values()):
        return {}
    return state


@contextlib.contextmanager
def exporter(args: list[str], listen: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The exporter with the sidecar's ``args``, listening on ``listen`` (host:port)
    rather than every address; yields its URL and process once it answers."""
    if not Path(EXPORTER).exists():
        pytest.fail("prometheus-nginx-exporter is not installed; `make system-deps` installs it")
    flags = [a for a in args if not a.startswith("--web.listen-address=")]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [EXPORTER, *flags, f"--web.listen-address={listen}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            url = f"http://{listen}"

            def answers() -> bool:
                with contextlib.suppress(requests.RequestException):
                    return requests.get(url + "/metrics", timeout=2).status_code == 200
                return False

            def said() -> str:
                log.seek(0)
                return f"the exporter on {url}; its log:\n{log.read().decode(errors='replace')}"

            wait_for(answers, said, 30)
            yield url, process
        finally:
            stop(process)


def wait_state(url: str, alert: str, state: str, timeout_s: float = 60) -> None:
    wait_for(
        lambda: rules_state(url)[alert]["state"] == state,
        lambda: f"{alert} {state}: {rules_state(url)[alert]}",
        timeout_s,
    )


@pytest.mark.e2e
def test_app_and_nginx_alerts_go_pending_as_gunicorn_nginx_and_the_exporter_go() -> None:
    status_port, exporter_port = free_port(), free_port()
    with helm.Chart.load(CHART) as chart:
        values = exporter_values(status_port, exporter_port)
        rule = prometheus_rule(chart, RELEASE, values)
        pod = containers(find(rendered(chart, values), "Deployment"))
    # nginx and the exporter as the chart configures them: the same status port.
    status = {"NGINX_STATUS_PORT": env_of(pod["nginx"])["NGINX_STATUS_PORT"]}
    with (
        gunicorn_server({"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1"}) as app,
        nginx_server(app.bind, status) as proxy,
        exporter(pod["nginx-exporter"]["args"], f"127.0.0.1:{exporter_port}") as (
            nginx_metrics,
            exporter_process,
        ),
        prometheus(
            {JOBS[RELEASE]: proxy.metrics_url, NGINX_JOBS[RELEASE]: nginx_metrics}, rule
        ) as (url, log),
    ):
        requests.post(proxy.url + "/predict", json={"text": "x"}, timeout=10).raise_for_status()
        for job in (JOBS[RELEASE], NGINX_JOBS[RELEASE]):
            up = f'up{{namespace="{NAMESPACE}", job="{job}"}}'
            wait_for(
                lambda up=up: [r for r in query(url, up) if r["value"][1] == "1"],
                lambda job=job: f"a scrape of {job}; Prometheus's log:\n{log.read_text()[-3000:]}",
                60,
            )
        # Every series the rules select is in Prometheus: the app's through
        # nginx, nginx's own from the exporter.
        for r in rules_of(rule):
            job = NGINX_JOBS[RELEASE] if r["alert"] in NGINX_ALERTS else JOBS[RELEASE]
            for name in metric_names(r["expr"]):
                selected = f'{name}{{namespace="{NAMESPACE}", job="{job}"}}'
                wait_for(lambda s=selected: query(url, s), f"{selected} in Prometheus", 30)
        # Every rule evaluated over the scraped series, without an error.
        evaluated = wait_for(lambda: evaluated_rules(url), "every rule's first evaluation", 30)
        assert set(evaluated) == ALERTS | NGINX_ALERTS
        assert all(r["health"] == "ok" for r in evaluated.values()), evaluated
        # absent() held before the first scrapes landed: inactive once they have.
        for alert in ("ServingCoreAppDown", "ServingCoreNginxExporterDown"):
            wait_state(url, alert, "inactive", 30)
        assert rules_state(url)["ServingCoreNginxDown"]["state"] == "inactive"
        handled = f'nginx_http_requests_total{{job="{NGINX_JOBS[RELEASE]}"}}'
        wait_for(lambda: query(url, handled), f"{handled} in Prometheus", 30)
        before = value(url, handled) or 0

        stop(app.process)
        assert requests.get(proxy.metrics_url + "/metrics", timeout=10).status_code == 502
        wait_state(url, "ServingCoreAppDown", "pending")
        (alert,) = rules_state(url)["ServingCoreAppDown"]["alerts"]
        assert (alert["labels"]["job"], alert["labels"]["namespace"]) == (JOBS[RELEASE], NAMESPACE)
        # nginx still answers (its 502s), and counts them among its requests.
        assert rules_state(url)["ServingCoreNginxDown"]["state"] == "inactive"
        wait_for(lambda: (value(url, handled) or 0) > before, "nginx's count rising", 30)

        stop(proxy.process)
        wait_state(url, "ServingCoreNginxDown", "pending")
        (alert,) = rules_state(url)["ServingCoreNginxDown"]["alerts"]
        assert alert["labels"]["job"] == NGINX_JOBS[RELEASE]
        assert rules_state(url)["ServingCoreNginxExporterDown"]["state"] == "inactive"

        stop(exporter_process)
        wait_state(url, "ServingCoreNginxExporterDown", "pending")
