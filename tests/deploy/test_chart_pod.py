"""The server pod: its knobs (scheduling, annotations, extra env and volumes), one
model on one GPU, and the drain that the preStop and the grace period follow."""

from __future__ import annotations

import helm_python as helm
import pytest

from serving_core.settings import Settings
from tests.deploy.chart import (
    KUBE_VERSIONS,
    POD_KNOBS,
    VALUE_SETS,
    containers,
    env_of,
    find,
    pod_spec,
    render,
    tagged,
    validate,
)

# --- the pod: knobs, GPU, drain ------------------------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_pod_knobs_render_and_validate(chart: helm.Chart, kube_version: str) -> None:
    docs = render(chart, POD_KNOBS)
    validate(docs, kube_version)
    deployment = find(docs, "Deployment")
    pod = deployment["spec"]["template"]
    for key in (
        "nodeSelector",
        "tolerations",
        "affinity",
        "runtimeClassName",
        "priorityClassName",
    ):
        assert pod["spec"][key] == POD_KNOBS[key], key
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert pod["metadata"]["annotations"] == POD_KNOBS["podAnnotations"]
    app = containers(deployment)["app"]
    assert app["env"][-2:] == POD_KNOBS["extraEnv"]
    assert POD_KNOBS["extraVolumes"][0] in pod["spec"]["volumes"]
    assert POD_KNOBS["extraVolumeMounts"][0] in app["volumeMounts"]
    assert POD_KNOBS["extraVolumeMounts"][0] not in containers(deployment)["nginx"]["volumeMounts"]


def test_pod_knobs_are_absent_unless_set(chart: helm.Chart) -> None:
    pod = find(render(chart, tagged({})), "Deployment")["spec"]["template"]
    for key in ("nodeSelector", "tolerations", "affinity", "runtimeClassName", "priorityClassName"):
        assert key not in pod["spec"], key
    assert "annotations" not in pod["metadata"]


def test_gpu_example_puts_one_model_on_one_gpu(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-gpu"])
    pod = pod_spec(docs)
    by_name = containers(find(docs, "Deployment"))
    app = by_name["app"]
    assert app["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["runtimeClassName"] == "nvidia"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    env = env_of(app)
    # One model copy on the card: the shared model process (auto on cuda) runs it
    # for every worker, however many there are.
    assert (env["SERVING_DEVICE"], env["SERVING_DTYPE"], env["SERVING_MODEL_PROCESS"]) == (
        "cuda",
        "float16",
        "auto",
    )
    assert int(env["SERVING_WORKERS"]) > 1
    settings = Settings(device=env["SERVING_DEVICE"], model_process="auto")
    assert settings.shared_model
    assert app["image"].endswith("-cu128")
    assert not by_name["nginx"]["image"].endswith("-cu128")


def test_the_drain_the_prestop_and_the_grace_period_match(chart: helm.Chart) -> None:
    values = tagged({"serving": {"drainSeconds": 6.5, "gracefulTimeoutSeconds": 20.5}})
    pod = pod_spec(render(chart, values))
    by_name = {c["name"]: c for c in pod["containers"]}
    # The app drains on SIGTERM itself (/readyz 503 first): no pause before it.
    assert "lifecycle" not in by_name["app"]
    assert env_of(by_name["app"])["SERVING_DRAIN_S"] == "6.5"
    # nginx accepts as long as the app does.
    assert by_name["nginx"]["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "7"]}}
    assert pod["terminationGracePeriodSeconds"] == 7 + 21 + 5


def test_a_grace_period_shorter_than_the_drain_is_refused(chart: helm.Chart) -> None:
    values = tagged(
        {
            "serving": {"drainSeconds": 30, "gracefulTimeoutSeconds": 30},
            "lifecycle": {"terminationGracePeriodSeconds": 45},
        }
    )
    with pytest.raises(helm.HelmRenderError, match=r"terminationGracePeriodSeconds \(45\)"):
        render(chart, values)


def test_an_explicit_grace_period_wins(chart: helm.Chart) -> None:
    assert pod_spec(render(chart, VALUE_SETS["values-full"]))["terminationGracePeriodSeconds"] == 90


def test_topology_spread_gets_the_server_selector(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-full"])
    deployment = find(docs, "Deployment")
    constraints = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]
    for constraint in constraints:
        assert (
            constraint["labelSelector"]["matchLabels"]
            == deployment["spec"]["selector"]["matchLabels"]
        )
