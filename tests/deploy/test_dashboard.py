"""The Grafana dashboard and the PrometheusRule alerts in deploy/: their PromQL parses
(promql-parser, Prometheus's grammar), and every metric they name is one a real
server or job worker exports."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import promql_parser
import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import HANDLERS, PROBE
from tests.servers import ROOT, free_port, gunicorn_server, job_worker

DASHBOARD = ROOT / "deploy/grafana/serving-core.json"
RULES = ROOT / "deploy/prometheus/serving-core-rules.yaml"
# The series Prometheus writes itself for every scrape, not any exporter's.
SCRAPE_SERIES = {"up"}
# Grafana's own variables, as Grafana would substitute them before querying.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$job": ".*"}
# The documented fields of monitoring.coreos.com/v1 PrometheusRule that we use.
PROMETHEUS_RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string"},
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": "^[0-9]+[smhdwy]$"},
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in board["panels"] for target in panel["targets"]]


def grafana_expanded(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr


def rule_exprs(rule: dict[str, Any]) -> list[str]:
    return [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]


def metric_names(expr: str) -> set[str]:
    names: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_dashboard_is_grafana_json_with_a_datasource_variable():
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.mark.parametrize(
    "title",
    [
        "Requests by status",
        "Inference latency",
        "Queue depth",
        "Batch size",
        "Batch duration",
        "Rejections by reason",
        "Model errors",
        "Cache hit ratio",
        "Job throughput",
        "Time to first token",
        "Inter-token latency",
        "Tokens per second",
        "Generations",
    ],
)
def test_dashboard_has_the_panel(title):
    assert title in {panel["title"] for panel in dashboard()["panels"]}


def test_dashboard_latency_panel_shows_p50_p95_p99_from_the_histogram():
    (panel,) = [p for p in dashboard()["panels"] if p["title"] == "Inference latency"]
    for quantile, target in zip(("0.5", "0.95", "0.99"), panel["targets"], strict=True):
        assert target["expr"].startswith(f"histogram_quantile({quantile},")
        assert "serving_request_duration_seconds_bucket" in target["expr"]
        assert "by (le, protocol)" in target["expr"]


# The route label of each inference front, as the app and the gRPC servicer set it.
INFERENCE_ROUTES = [
    "/predict",
    "/v2/models/<name>/infer",
    "/v2/models/<name>/versions/<version>/infer",
    "/inference.GRPCInferenceService/ModelInfer",
]


@pytest.mark.parametrize("route", INFERENCE_ROUTES)
def test_the_latency_panel_and_alert_cover_every_inference_front(route: str) -> None:
    (panel,) = [p for p in dashboard()["panels"] if p["title"] == "Inference latency"]
    rules = yaml.safe_load(RULES.read_text())
    (alert,) = [
        r
        for g in rules["spec"]["groups"]
        for r in g["rules"]
        if r.get("alert") == "ServingCoreP99OverDeadline"
    ]
    for expr in [*(t["expr"] for t in panel["targets"]), alert["expr"]]:
        (pattern,) = re.findall(r'route=~"([^"]+)"', expr)
        # Prometheus anchors a label regex at both ends, as fullmatch does.
        assert re.fullmatch(pattern, route), (route, expr)
    assert not re.fullmatch(pattern, "/v2/models/<name>/ready")


def test_every_dashboard_expression_parses_as_promql():
    exprs = dashboard_exprs(dashboard())
    assert len(exprs) >= 12
    for expr in exprs:
        promql_parser.parse(grafana_expanded(expr))


def test_a_broken_expression_does_not_parse():
    with pytest.raises(ValueError, match="parenthesis"):
        promql_parser.parse("sum(rate(serving_requests_total[5m])")


def test_the_prometheus_rule_is_valid_and_its_expressions_parse():
    rule = yaml.safe_load(RULES.read_text())
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    alerts = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert alerts == {
        "ServingCoreAppDown",
        "ServingCoreHigh5xxRate",
        "ServingCoreSustained503",
        "ServingCoreP99OverDeadline",
    }
    for expr in rule_exprs(rule):
        promql_parser.parse(expr)


def exported_names(text: str) -> set[str]:
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


@pytest.mark.e2e
def test_every_metric_the_dashboard_and_alerts_name_is_exported(tmp_path: Path):
    used = set().union(*(metric_names(grafana_expanded(e)) for e in dashboard_exprs(dashboard())))
    used |= set().union(*(metric_names(e) for e in rule_exprs(yaml.safe_load(RULES.read_text()))))
    assert {"serving_requests_total", "serving_jobs_total", "up"} <= used
    used -= SCRAPE_SERIES

    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "1",
        "SERVING_JOBS_PATH": str(tmp_path / "jobs.db"),
    }
    exported: set[str] = set()
    with gunicorn_server(env) as server, job_worker(env, tmp_path) as (_, worker_url, _):
        predict = server.url + "/predict"
        for _ in range(2):  # the repeat is a cache hit
            requests.post(predict, json={"text": "same"}, timeout=10).raise_for_status()
        assert requests.post(predict, json={"fail": True}, timeout=10).status_code == 500
        late = requests.post(
            predict, json={"text": "late"}, headers={"X-Request-Timeout": "0.000001"}, timeout=10
        )
        assert late.status_code == 504  # a rejection
        job = requests.post(server.url + "/jobs", json={"text": "job"}, timeout=10).json()
        deadline = time.monotonic() + 60
        while requests.get(server.url + job["status_url"], timeout=10).json()["status"] != "done":
            assert time.monotonic() < deadline, "the job was not done in 60 s"
            time.sleep(0.05)
        exported |= exported_names(requests.get(server.url + "/metrics", timeout=10).text)
        exported |= exported_names(requests.get(worker_url + "/metrics", timeout=10).text)
    # A Redis nobody listens on: the cache's errors are counted (and answered as misses).
    dead_redis = {"SERVING_CACHE_URL": f"redis://127.0.0.1:{free_port()}/0", **env}
    with gunicorn_server(dead_redis) as server:
        requests.post(server.url + "/predict", json={"text": "x"}, timeout=10).raise_for_status()
        exported |= exported_names(requests.get(server.url + "/metrics", timeout=10).text)

    # A generating handler's metrics, after one stream.
    generating = {**env, "SERVING_HANDLER": str(HANDLERS / "generating/handler.py")}
    with gunicorn_server(generating) as server:
        stream = requests.post(
            server.url + "/predict",
            json={"n": 3},
            headers={"Accept": "text/event-stream"},
            timeout=10,
        )
        assert b"event: end" in stream.content
        exported |= exported_names(requests.get(server.url + "/metrics", timeout=10).text)

    missing = used - exported
    assert not missing, f"named by deploy/ but not exported: {sorted(missing)}"
    assert all(re.fullmatch(r"serving_[a-z_]+", name) for name in used)
