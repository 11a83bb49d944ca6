"""Rolling out a model (rollout.*): the stable release's HTTPRoute splits traffic by
weight with the canary release and mirrors it to a shadow, valid against the Gateway
API's own CRD; ingress-nginx's canary annotations are the alternative; each pod carries
its model revision, which the ServiceMonitors copy to every series."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import helm_python as helm
import jsonschema
import pytest

from tests.deploy.chart import (
    BATCH,
    CHART,
    KUBE_VERSIONS,
    QUEUE_URL,
    TAG,
    VALUE_SETS,
    find,
    render,
    tagged,
    validate,
)
from tests.deploy.keda_crd import HTTP_ROUTE

GATEWAY = [{"name": "public", "namespace": "gateway-system", "sectionName": "https"}]
CANARY = "demo-canary-serving-core"
SHADOW = "demo-shadow-serving-core"
LABEL = "serving-core.io/model-revision"


def route_values(**rollout: Any) -> dict[str, Any]:
    return tagged({"rollout": {"httpRoute": {"enabled": True, "parentRefs": GATEWAY}, **rollout}})


def route(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == "HTTPRoute"]
    return found


def backends(docs: list[dict[str, Any]]) -> dict[str, int]:
    (rule,) = route(docs)["spec"]["rules"]
    return {ref["name"]: ref["weight"] for ref in rule["backendRefs"]}


# --- the HTTPRoute: weights and a mirror --------------------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_route_splits_by_weight_and_mirrors_to_the_shadow(
    chart: helm.Chart, kube_version: str
) -> None:
    values = route_values(canary={"service": CANARY, "weight": 10}, mirror={"service": SHADOW})
    values["rollout"]["httpRoute"]["hostnames"] = ["serving.example.com"]
    docs = render(chart, values)
    validate(docs, kube_version)  # against the vendored HTTPRoute CRD
    spec = route(docs)["spec"]
    assert spec["parentRefs"] == GATEWAY
    assert spec["hostnames"] == ["serving.example.com"]
    (rule,) = spec["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["backendRefs"] == [
        {"name": "demo-serving-core", "port": 80, "weight": 90},
        {"name": CANARY, "port": 80, "weight": 10},
    ]
    assert rule["filters"] == [
        {
            "type": "RequestMirror",
            "requestMirror": {"backendRef": {"name": SHADOW, "port": 80}, "percent": 100},
        }
    ]
    # The stable release's own Service is the first backend.
    assert find(docs, "Service")["metadata"]["name"] == "demo-serving-core"


@pytest.mark.parametrize(("weight", "stable"), [(0, 100), (50, 50), (100, 0)])
def test_the_weights_always_add_up_to_a_hundred(
    chart: helm.Chart, weight: int, stable: int
) -> None:
    docs = render(chart, route_values(canary={"service": CANARY, "weight": weight}))
    validate(docs, "1.33")
    assert backends(docs) == {"demo-serving-core": stable, CANARY: weight}


def test_a_route_without_a_rollout_sends_everything_to_this_release(chart: helm.Chart) -> None:
    docs = render(chart, route_values())
    validate(docs, "1.33")
    assert backends(docs) == {"demo-serving-core": 100}
    (rule,) = route(docs)["spec"]["rules"]
    assert "filters" not in rule


def test_a_partial_mirror_copies_that_percent(chart: helm.Chart) -> None:
    docs = render(chart, route_values(mirror={"service": SHADOW, "percent": 20}))
    validate(docs, "1.33")
    (rule,) = route(docs)["spec"]["rules"]
    assert rule["filters"][0]["requestMirror"]["percent"] == 20


def test_the_routes_timeout_outlasts_the_longest_answer(chart: helm.Chart) -> None:
    # As the Ingress's read timeout: max(request, generation) + 10 s.
    (rule,) = route(render(chart, route_values()))["spec"]["rules"]
    assert rule["timeouts"] == {"request": "310s", "backendRequest": "310s"}
    values = route_values()
    values["rollout"]["httpRoute"]["requestTimeoutSeconds"] = 900
    (rule,) = route(render(chart, values))["spec"]["rules"]
    assert rule["timeouts"] == {"request": "900s", "backendRequest": "900s"}


def test_the_crd_check_has_teeth(chart: helm.Chart) -> None:
    good = route(render(chart, route_values(mirror={"service": SHADOW})))
    HTTP_ROUTE.validate(good)
    misspelt = copy.deepcopy(good)
    misspelt["spec"]["rules"][0]["filters"][0]["requestMirror"]["percentage"] = 10
    heavy = copy.deepcopy(good)
    heavy["spec"]["rules"][0]["backendRefs"][0]["weight"] = 1000001
    for bad in (misspelt, heavy):
        with pytest.raises(jsonschema.ValidationError):
            HTTP_ROUTE.validate(bad)


def test_a_canary_pair_names_each_others_services(chart: helm.Chart) -> None:
    # The examples, released as the stable half names them: minilm and minilm-canary.
    stable = render(chart, VALUE_SETS["values-rollout-stable"], name="minilm")
    canary = render(chart, VALUE_SETS["values-rollout-canary"], name="minilm-canary")
    for docs in (stable, canary):
        validate(docs, "1.33")
    canary_service = find(canary, "Service")["metadata"]["name"]
    assert backends(stable) == {"minilm-serving-core": 90, canary_service: 10}
    assert not [d for d in canary if d["kind"] in {"HTTPRoute", "Ingress"}]
    revisions = {
        find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"][LABEL]
        for docs in (stable, canary)
    }
    assert revisions == {"minilm-2026-11-30", "minilm-2026-12-03"}


# --- ingress-nginx's canary annotations ------------------------------------------------


def ingress_values(**canary: Any) -> dict[str, Any]:
    return tagged(
        {
            "ingress": {"enabled": True, "controller": "ingress-nginx", "className": "nginx"},
            "rollout": {"ingressNginxCanary": {"enabled": True, **canary}},
        }
    )


def test_the_canary_releases_ingress_carries_ingress_nginx_canary_annotations(
    chart: helm.Chart,
) -> None:
    docs = render(chart, ingress_values(weight=10, header="X-Canary"))
    validate(docs, "1.33")
    annotations = find(docs, "Ingress")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/canary"] == "true"
    assert annotations["nginx.ingress.kubernetes.io/canary-weight"] == "10"
    assert annotations["nginx.ingress.kubernetes.io/canary-by-header"] == "X-Canary"
    # The controller's own annotations stay.
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "310"


def test_the_stable_ingress_has_no_canary_annotations(chart: helm.Chart) -> None:
    values = ingress_values()
    values["rollout"]["ingressNginxCanary"]["enabled"] = False
    annotations = find(render(chart, values), "Ingress")["metadata"]["annotations"]
    assert not [key for key in annotations if "canary" in key]
    no_header = find(render(chart, ingress_values()), "Ingress")["metadata"]["annotations"]
    assert "nginx.ingress.kubernetes.io/canary-by-header" not in no_header


def test_ingress_annotations_win_over_the_canary_weight(chart: helm.Chart) -> None:
    values = ingress_values(weight=10)
    values["ingress"]["annotations"] = {"nginx.ingress.kubernetes.io/canary-weight": "25"}
    annotations = find(render(chart, values), "Ingress")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/canary-weight"] == "25"


# --- the model revision on every pod and every series -----------------------------------

EVERY_POD: dict[str, Any] = {
    "serving": {"jobsUrl": QUEUE_URL},
    "worker": {"enabled": True},
    "stream": {
        "enabled": True,
        "source": "redis://redis.stream.svc:6379/0?stream=in&group=serving-core",
        "sink": "redis://redis.stream.svc:6379/0?stream=out",
        "deadLetter": "redis://redis.stream.svc:6379/0?stream=dead",
    },
    "batch": BATCH,
    "metrics": {"serviceMonitor": {"enabled": True}},
}


def loading_pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod templates' metadata of server, worker, stream and batch."""
    metas = []
    for doc in docs:
        spec = doc.get("spec", {})
        template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
        if template and doc["kind"] in {"Deployment", "Job", "CronJob"}:
            metas.append(template["metadata"])
    return metas


@pytest.mark.parametrize(
    ("revision", "label"),
    [
        ("minilm-2026-12-03", "minilm-2026-12-03"),
        ("sha256:0123456789abcdef", "sha256-0123456789abcdef"),
        ("v2/" + "x" * 70 + ":", "v2-" + "x" * 60),
        ("", TAG),  # the image's own tag
    ],
)
def test_every_pod_carries_its_model_revision_as_a_label(
    chart: helm.Chart, revision: str, label: str
) -> None:
    values = tagged({**EVERY_POD, "serving": {**EVERY_POD["serving"], "modelRevision": revision}})
    docs = render(chart, values)
    validate(docs, "1.33")  # a label value Kubernetes takes
    metas = loading_pods(docs)
    assert len(metas) == 4
    assert [m["labels"][LABEL] for m in metas] == [label] * 4
    assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", label)


def test_a_new_revision_leaves_the_selectors_alone(chart: helm.Chart) -> None:
    # Selectors are immutable: the label must change the pods, never what selects them.
    def selectors(revision: str) -> list[Any]:
        values = tagged(
            {**EVERY_POD, "serving": {**EVERY_POD["serving"], "modelRevision": revision}}
        )
        docs = render(chart, values)
        return [d["spec"]["selector"] for d in docs if d["kind"] in {"Deployment", "Service"}]

    assert selectors("minilm-a") == selectors("minilm-b")
    assert LABEL not in str(selectors("minilm-a"))


def test_every_service_monitor_copies_the_revision_to_its_series(chart: helm.Chart) -> None:
    docs = render(chart, tagged(EVERY_POD))
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert len(monitors) == 3  # server, worker, stream
    for monitor in monitors:
        assert monitor["spec"]["podTargetLabels"] == [LABEL]


# --- refusals ----------------------------------------------------------------------------

REFUSALS = [
    (
        {"rollout": {"canary": {"service": CANARY, "weight": 10}}},
        "rollout.canary.service and rollout.mirror.service are backends of this release's "
        "HTTPRoute: set rollout.httpRoute.enabled",
    ),
    (
        {"rollout": {"httpRoute": {"enabled": True}}},
        "rollout.httpRoute.enabled needs rollout.httpRoute.parentRefs",
    ),
    (
        route_values(canary={"service": "demo-serving-core", "weight": 10}),
        "rollout.canary.service (demo-serving-core) is this release's own Service",
    ),
    (
        route_values(canary={"service": CANARY}, mirror={"service": CANARY}),
        f"rollout.canary.service and rollout.mirror.service are both {CANARY}",
    ),
    (
        route_values(canary={"weight": 10}),
        "rollout.canary.weight (10) sends that percent of requests to the canary: set "
        "rollout.canary.service",
    ),
    (
        {
            "serving": {"generationTimeoutSeconds": 600},
            "rollout": {
                "httpRoute": {"enabled": True, "parentRefs": GATEWAY, "requestTimeoutSeconds": 300}
            },
        },
        "rollout.httpRoute.requestTimeoutSeconds (300) is shorter than the longest the app "
        "works on a request",
    ),
    (
        {"rollout": {"ingressNginxCanary": {"enabled": True}}},
        "rollout.ingressNginxCanary.enabled marks this release's Ingress as the canary of the "
        "stable release's: set ingress.enabled",
    ),
    (
        {
            "ingress": {"enabled": True, "controller": "contour"},
            "rollout": {"ingressNginxCanary": {"enabled": True}},
        },
        'but ingress.controller is "contour": set ingress.controller=ingress-nginx',
    ),
]


@pytest.mark.parametrize(("values", "message"), REFUSALS)
def test_bad_rollouts_are_refused_saying_what_to_change(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(tagged(values), name="demo", namespace="serving")


@pytest.mark.parametrize(
    ("rollout", "where"),
    [
        ({"canary": {"weight": 101}}, "/rollout/canary/weight"),
        ({"mirror": {"percent": -1}}, "/rollout/mirror/percent"),
        ({"canary": {"service": "Canary_Service"}}, "/rollout/canary/service"),
        ({"httpRoute": {"parentRefs": [{"nmae": "gw"}]}}, "/rollout/httpRoute/parentRefs/0"),
    ],
)
def test_the_schema_refuses_bad_rollout_values(
    chart: helm.Chart, rollout: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.render(tagged({"rollout": rollout}), name="demo", namespace="serving")


def test_the_dashboard_compares_revisions_by_the_label_the_monitors_copy(
    chart: helm.Chart,
) -> None:
    (key,) = find(render(chart, tagged(EVERY_POD)), "ServiceMonitor")["spec"]["podTargetLabels"]
    # Prometheus' name for a copied pod label: each character outside [a-zA-Z0-9_] is _.
    label = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    board = json.loads((CHART / "dashboards" / "serving-core.json").read_text())
    panels = [p for p in board["panels"] if p["title"].endswith("by model revision")]
    assert len(panels) == 2
    for panel in panels:
        for target in panel["targets"]:
            assert re.search(rf"by \((le, )?{label}\)", target["expr"]), target["expr"]
            assert "{{" + label + "}}" in target["legendFormat"]
