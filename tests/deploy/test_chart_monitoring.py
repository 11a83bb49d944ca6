"""What Prometheus and Grafana get: the metrics Service and ServiceMonitor, the
dashboard ConfigMap and the PrometheusRule."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    KUBE_VERSIONS,
    ROOT,
    VALUE_SETS,
    find,
    lint_errors,
    render,
    tagged,
)

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
