"""The alerts under Prometheus's own rule engine: `promtool test rules` (Debian's
prometheus package) over the series of two releases in one namespace. Each
release's rules fire for its own metrics job only, by its own thresholds;
ServingCoreAppDown fires when the app's target fails its scrape or is gone, and
the nginx alerts when nginx stops answering its exporter or the exporter goes."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.chart import render, tagged
from tests.deploy.test_dashboard import RULES
from tests.servers import ROOT

NAMESPACE = "serving"  # the namespace render() installs into
RUNBOOKS = ROOT / "docs/observability.md"
DEFAULT_RUNBOOK_BASE = (
    "https://github.com/serving-core/serving-core/blob/main/docs/observability.md"
)
ALERTS = {
    "ServingCoreAppDown",
    "ServingCoreHigh5xxRate",
    "ServingCoreSustained503",
    "ServingCoreP99OverDeadline",
}
# The chart's alerts over nginx's exporter (nginx.exporter.enabled); the
# standalone rules have none, since they know of no exporter.
NGINX_ALERTS = {"ServingCoreNginxDown", "ServingCoreNginxExporterDown"}
# Two releases of the iris example side by side, with different thresholds:
# under the same traffic (TROUBLED below) only setosa's are crossed.
RELEASES: dict[str, dict[str, Any]] = {
    "iris-setosa": {
        "serving": {"requestTimeoutSeconds": 5},
        "metrics": {"prometheusRule": {"enabled": True, "errorRatio": 0.1, "overloadRatio": 0.1}},
        "nginx": {"exporter": {"enabled": True}},
    },
    "iris-virginica": {
        "serving": {"requestTimeoutSeconds": 30},
        "metrics": {"prometheusRule": {"enabled": True, "errorRatio": 0.3, "overloadRatio": 0.3}},
        "nginx": {"exporter": {"enabled": True}},
    },
}
# What the Prometheus Operator names the release's targets' job: its metrics Service.
JOBS = {release: f"{release}-serving-core-metrics" for release in RELEASES}
# The exporter's targets, relabelled by the ServiceMonitor to a job of their own.
NGINX_JOBS = {release: f"{release}-serving-core-nginx" for release in RELEASES}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed; `make system-deps` installs Debian's prometheus")
    return found


def prometheus_rule(chart: helm.Chart, release: str, values: dict[str, Any]) -> dict[str, Any]:
    (rule,) = [
        d for d in render(chart, tagged(values), name=release) if d["kind"] == "PrometheusRule"
    ]
    return rule  # type: ignore[no-any-return]


def rules_of(rule: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


@pytest.fixture(scope="module")
def release_rules(chart: helm.Chart) -> dict[str, dict[str, Any]]:
    return {
        release: prometheus_rule(chart, release, values) for release, values in RELEASES.items()
    }


def series(job: str, traffic: dict[str, str]) -> list[dict[str, str]]:
    """One release's input series from `traffic`, in answers per minute: `ok` (fast
    200s), `failed` (500s), `refused` (503s) and `slow` (200s that took up to the
    `slow_le` bucket's bound); `up` is the target's scrape results, None: no target.
    `nginx_up` (what the exporter found) and `exporter_up` (its scrape) are the
    exporter's series, under the release's nginx job; None: no exporter target."""
    at = f'namespace="{NAMESPACE}", job="{job}"'
    predict = f'{at}, route="/predict"'
    ok, failed, refused, slow = (int(traffic[k]) for k in ("ok", "failed", "refused", "slow"))
    counts = {"200": ok + slow - failed - refused, "500": failed, "503": refused}
    found = [
        {"series": f'serving_requests_total{{{predict}, status="{status}"}}', "values": f"0+{n}x60"}
        for status, n in counts.items()
    ]
    for le in ("1", "5", "10", "60", "+Inf"):
        slow_here = le == "+Inf" or float(le) >= float(traffic["slow_le"])
        bucket = f'serving_request_duration_seconds_bucket{{{predict}, le="{le}"}}'
        found.append({"series": bucket, "values": f"0+{ok + slow if slow_here else ok}x60"})
    if traffic["up"] is not None:
        pod = f'pod="{job}-7d9f-x2x", instance="10.0.0.7:9090", endpoint="metrics"'
        found.append({"series": f"up{{{at}, {pod}}}", "values": traffic["up"]})
    if traffic.get("exporter_up") is not None:
        nginx_job = job.removesuffix("-metrics") + "-nginx"
        at = f'namespace="{NAMESPACE}", job="{nginx_job}"'
        pod = f'pod="{job}-7d9f-x2x", instance="10.0.0.7:9113", endpoint="nginx-metrics"'
        found.append({"series": f"up{{{at}, {pod}}}", "values": traffic["exporter_up"]})
        found.append({"series": f"nginx_up{{{at}, {pod}}}", "values": traffic["nginx_up"]})
    return found


# A release that answers fast and without failures.
HEALTHY: dict[str, Any] = {
    "ok": "100",
    "failed": "0",
    "refused": "0",
    "slow": "0",
    "slow_le": "1",
    "up": "1x60",
    "nginx_up": "1x60",
    "exporter_up": "1x60",
}
# 20% 500s, 20% 503s and a p99 of 9.95 s: over iris-setosa's thresholds, under
# iris-virginica's.
TROUBLED: dict[str, Any] = {
    "ok": "0",
    "failed": "20",
    "refused": "20",
    "slow": "100",
    "slow_le": "10",
    "up": "1x60",
    "nginx_up": "1x60",
    "exporter_up": "1x60",
}
# 40% 500s, 40% 503s and a p99 of 59.7 s: over both releases' thresholds.
FAILING: dict[str, Any] = {**TROUBLED, "failed": "40", "refused": "40", "slow_le": "60"}


def expected(rule: dict[str, Any], release: str, alerts: set[str]) -> list[dict[str, Any]]:
    """promtool's alert_rule_test entries: `alerts` fire for `release`'s job, the others do not."""
    tests = []
    for r in rules_of(rule):
        annotations = {k: v for k, v in r["annotations"].items() if k != "description"}
        job = NGINX_JOBS[release] if r["alert"] in NGINX_ALERTS else JOBS[release]
        labels = {"namespace": NAMESPACE, "job": job, **r["labels"]}
        fired = (
            [{"exp_labels": labels, "exp_annotations": annotations}] if r["alert"] in alerts else []
        )
        tests.append({"eval_time": "40m", "alertname": r["alert"], "exp_alerts": fired})
    return tests


def promtool_test(
    promtool: str,
    tmp_path: Path,
    rules: list[dict[str, Any]],
    inputs: list[dict[str, str]],
    alerts: list[dict[str, Any]],
) -> None:
    """Runs `promtool test rules` over `rules` (PrometheusRules), `inputs` and the
    expected `alerts`. The descriptions are left out: they print $value, which the
    rule engine computes to the last float digit; promtool check rules parses them."""
    groups = []
    for rule in rules:
        for group in copy.deepcopy(rule["spec"]["groups"]):
            for r in group["rules"]:
                r["annotations"].pop("description")
            groups.append(group)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": alerts}],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_under_the_same_traffic_each_release_is_judged_by_its_own_thresholds(
    promtool: str, tmp_path: Path, release_rules: dict[str, dict[str, Any]]
) -> None:
    inputs = [s for release in RELEASES for s in series(JOBS[release], TROUBLED)]
    setosa = release_rules["iris-setosa"]
    alerts = expected(setosa, "iris-setosa", ALERTS - {"ServingCoreAppDown"})
    promtool_test(promtool, tmp_path, list(release_rules.values()), inputs, alerts)


@pytest.mark.parametrize("troubled", list(RELEASES))
def test_each_releases_alerts_fire_for_its_own_job_only(
    promtool: str, tmp_path: Path, release_rules: dict[str, dict[str, Any]], troubled: str
) -> None:
    # The other release is healthy, so a rule that judged every job of the
    # namespace would fire twice (once from each release's rule).
    inputs = [
        s
        for release in RELEASES
        for s in series(JOBS[release], FAILING if release == troubled else HEALTHY)
    ]
    alerts = expected(release_rules[troubled], troubled, ALERTS - {"ServingCoreAppDown"})
    promtool_test(promtool, tmp_path, list(release_rules.values()), inputs, alerts)


@pytest.mark.parametrize(
    "up",
    [
        pytest.param(
            "1x5 0x55", id="scrape-fails"
        ),  # gunicorn gone: nginx answers /metrics with 502
        pytest.param("1x5", id="target-gone"),  # no pod left: the series ends
        pytest.param(None, id="never-scraped"),
    ],
)
def test_app_down_fires_for_the_release_whose_app_is_gone(
    promtool: str, tmp_path: Path, release_rules: dict[str, dict[str, Any]], up: str | None
) -> None:
    down = "iris-virginica"
    inputs = [
        s
        for release in RELEASES
        for s in series(JOBS[release], {**HEALTHY, "up": up if release == down else "1x60"})
    ]
    alerts = expected(release_rules[down], down, {"ServingCoreAppDown"})
    promtool_test(promtool, tmp_path, list(release_rules.values()), inputs, alerts)


def test_the_standalone_rules_judge_their_own_job_only(promtool: str, tmp_path: Path) -> None:
    standalone = yaml.safe_load(RULES.read_text())
    job = "serving-core-metrics"
    # The other job fails everything; the rules name serving-core-metrics only.
    troubled = {**FAILING, "failed": "20", "refused": "20", "up": "1x5 0x55"}
    inputs = series(job, troubled) + series("other-metrics", {**FAILING, "up": "0x60"})
    alerts = []
    for r in rules_of(standalone):
        annotations = {k: v for k, v in r["annotations"].items() if k != "description"}
        labels = {"namespace": NAMESPACE, "job": job, **r["labels"]}
        alerts.append(
            {
                "eval_time": "40m",
                "alertname": r["alert"],
                "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
            }
        )
    promtool_test(promtool, tmp_path, [standalone], inputs, alerts)


def test_promtool_accepts_every_rule_with_its_description(
    promtool: str, tmp_path: Path, release_rules: dict[str, dict[str, Any]]
) -> None:
    for name, rule in {**release_rules, "standalone": yaml.safe_load(RULES.read_text())}.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        result = subprocess.run(
            [promtool, "check", "rules", str(path)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert {r["alert"] for r in rules_of(rule)} == (
            ALERTS if name == "standalone" else ALERTS | NGINX_ALERTS
        )


@pytest.mark.parametrize(
    ("nginx", "fired"),
    [
        # nginx gone in the pod: the exporter still answers, with nginx_up 0.
        pytest.param({"nginx_up": "1x5 0x55"}, "ServingCoreNginxDown", id="nginx-gone"),
        # A failed scrape has no nginx_up at all: its series ends.
        pytest.param(
            {"nginx_up": "1x5", "exporter_up": "1x5 0x55"},
            "ServingCoreNginxExporterDown",
            id="exporter-fails",
        ),
        pytest.param(
            {"nginx_up": "1x5", "exporter_up": "1x5"},
            "ServingCoreNginxExporterDown",
            id="exporter-gone",
        ),
        pytest.param({"exporter_up": None}, "ServingCoreNginxExporterDown", id="never-scraped"),
    ],
)
def test_nginx_alerts_fire_for_the_release_whose_nginx_or_exporter_is_gone(
    promtool: str,
    tmp_path: Path,
    release_rules: dict[str, dict[str, Any]],
    nginx: dict[str, Any],
    fired: str,
) -> None:
    down = "iris-setosa"
    inputs = [
        s
        for release in RELEASES
        for s in series(JOBS[release], {**HEALTHY, **nginx} if release == down else HEALTHY)
    ]
    alerts = expected(release_rules[down], down, {fired})
    promtool_test(promtool, tmp_path, list(release_rules.values()), inputs, alerts)


def test_the_nginx_alerts_come_with_the_exporter_only(chart: helm.Chart) -> None:
    values = copy.deepcopy(RELEASES["iris-setosa"])
    values["nginx"]["exporter"]["enabled"] = False
    assert {r["alert"] for r in rules_of(prometheus_rule(chart, "x", values))} == ALERTS


def anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings, as GitHub and MkDocs both spell alert names."""
    return {
        re.sub(r"[^a-z0-9_-]", "", heading.strip().lower().replace(" ", "-"))
        for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    }


def test_every_rule_has_a_runbook_url_to_its_section_of_the_docs(
    release_rules: dict[str, dict[str, Any]],
) -> None:
    sections = anchors(RUNBOOKS.read_text())
    for rule in [*release_rules.values(), yaml.safe_load(RULES.read_text())]:
        for r in rules_of(rule):
            base, _, anchor = r["annotations"]["runbook_url"].partition("#")
            assert base == DEFAULT_RUNBOOK_BASE, r["alert"]
            assert anchor == r["alert"].lower()
            assert anchor in sections, f"docs/observability.md has no section for {r['alert']}"


def test_the_runbook_base_url_is_a_value(chart: helm.Chart) -> None:
    values = copy.deepcopy(RELEASES["iris-setosa"])
    values["metrics"]["prometheusRule"]["runbookBaseUrl"] = "https://docs.example.com/runbooks/"
    urls = {r["annotations"]["runbook_url"] for r in rules_of(prometheus_rule(chart, "x", values))}
    assert urls == {
        f"https://docs.example.com/runbooks/#{alert.lower()}" for alert in ALERTS | NGINX_ALERTS
    }


def test_a_runbook_base_url_with_an_anchor_is_refused(chart: helm.Chart) -> None:
    values = copy.deepcopy(RELEASES["iris-setosa"])
    values["metrics"]["prometheusRule"]["runbookBaseUrl"] = "https://docs.example.com/#runbooks"
    with pytest.raises(Exception, match=r"(?i)runbookBaseUrl"):
        render(chart, tagged(values))
