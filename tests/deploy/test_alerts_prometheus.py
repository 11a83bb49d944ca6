"""The chart's alerts in a real Prometheus (Debian's prometheus package) that
scrapes a real app through real nginx, as the ServiceMonitor does: every rule
finds the series it selects and evaluates without error, and ServingCoreAppDown goes
pending once gunicorn is gone while nginx still answers (502) on /metrics."""

from __future__ import annotations

import contextlib
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
from tests.deploy.test_alerts import ALERTS, JOBS, NAMESPACE, RELEASES, prometheus_rule
from tests.deploy.test_chart import CHART
from tests.deploy.test_dashboard import metric_names, rule_exprs
from tests.nginx_server import nginx_server
from tests.servers import free_port, gunicorn_server, stop, wait_for

RELEASE = "iris-setosa"


@contextlib.contextmanager
def prometheus(metrics_url: str, rule: dict[str, Any]) -> Iterator[tuple[str, Path]]:
    """Prometheus scraping ``metrics_url`` every second as the release's job, with
    ``rule``'s groups loaded; yields its URL and its log."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.fail("prometheus is not installed; `make system-deps` installs Debian's prometheus")
    host = metrics_url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {
                "job_name": JOBS[RELEASE],
                "static_configs": [{"targets": [host], "labels": {"namespace": NAMESPACE}}],
            }
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


@pytest.mark.e2e
def test_app_down_goes_pending_when_gunicorn_is_gone_behind_a_live_nginx() -> None:
    with helm.Chart.load(CHART) as chart:
        rule = prometheus_rule(chart, RELEASE, RELEASES[RELEASE])
    with (
        gunicorn_server({"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1"}) as app,
        nginx_server(app.bind) as proxy,
        prometheus(proxy.metrics_url, rule) as (url, log),
    ):
        requests.post(proxy.url + "/predict", json={"text": "x"}, timeout=10).raise_for_status()
        up = f'up{{namespace="{NAMESPACE}", job="{JOBS[RELEASE]}"}}'
        wait_for(
            lambda: [r for r in query(url, up) if r["value"][1] == "1"],
            lambda: f"a scrape through nginx; Prometheus's log:\n{log.read_text()[-3000:]}",
            60,
        )
        # Every series the rules select is in Prometheus, scraped through nginx.
        for expr in rule_exprs(rule):
            for name in metric_names(expr):
                selected = f'{name}{{namespace="{NAMESPACE}", job="{JOBS[RELEASE]}"}}'
                wait_for(lambda s=selected: query(url, s), f"{selected} in Prometheus", 30)
        # Every rule evaluated over the scraped series, without an error.
        evaluated = wait_for(lambda: evaluated_rules(url), "every rule's first evaluation", 30)
        assert set(evaluated) == ALERTS
        assert all(r["health"] == "ok" for r in evaluated.values()), evaluated
        # absent() held before the first scrape landed: inactive once it has.
        wait_for(
            lambda: rules_state(url)["ServingCoreAppDown"]["state"] == "inactive",
            lambda: f"ServingCoreAppDown inactive: {rules_state(url)['ServingCoreAppDown']}",
            30,
        )

        stop(app.process)
        assert requests.get(proxy.metrics_url + "/metrics", timeout=10).status_code == 502
        wait_for(
            lambda: rules_state(url)["ServingCoreAppDown"]["state"] == "pending",
            lambda: f"ServingCoreAppDown pending: {rules_state(url)['ServingCoreAppDown']}",
            60,
        )
        (alert,) = rules_state(url)["ServingCoreAppDown"]["alerts"]
        assert alert["labels"]["job"] == JOBS[RELEASE]
        assert alert["labels"]["namespace"] == NAMESPACE
