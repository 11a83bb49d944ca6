"""Batch: `serving-core batch` as an Indexed Job or a CronJob."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import helm_python as helm
import pytest

from serving_core.commands.cli import main as serving_core_main
from tests.deploy.chart import (
    BATCH,
    CACHE_SECRET,
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

# --- batch: `serving-core batch` as an Indexed Job or a CronJob -------------------


def batch_job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The batch Job's spec, or the CronJob's job template's."""
    kinds = {
        d["kind"]
        for d in docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "batch"
    }
    if kinds == {"CronJob"}:
        return find(docs, "CronJob", "batch")["spec"]["jobTemplate"]["spec"]  # type: ignore[no-any-return]
    return find(docs, "Job", "batch")["spec"]  # type: ignore[no-any-return]


def test_batch_is_off_by_default(chart: helm.Chart) -> None:
    kinds = {d["kind"] for d in render(chart, tagged({}))}
    assert not kinds & {"Job", "CronJob"}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_batch_job_is_indexed_with_the_values_completions_and_parallelism(
    chart: helm.Chart, kube_version: str
) -> None:
    docs = render(
        chart, tagged({"batch": BATCH | {"backoffLimit": 2, "activeDeadlineSeconds": 3600}})
    )
    validate(docs, kube_version)
    assert "CronJob" not in {d["kind"] for d in docs}
    spec = batch_job(docs)
    assert spec["completionMode"] == "Indexed"
    assert (spec["completions"], spec["parallelism"]) == (4, 2)
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (2, 3600)
    # Kept once finished: an upgrade that found it deleted would run it again.
    assert "ttlSecondsAfterFinished" not in spec
    pod = spec["template"]["spec"]
    # A retry is a new pod (the failed one keeps its logs); podFailurePolicy needs Never.
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == ["serving-core", "batch"]
    # Each pod reads its index from JOB_COMPLETION_INDEX; the chart says how many.
    assert container["args"] == [*BATCH["args"], "--shards", "4"]


@pytest.mark.parametrize("none", [{"rules": []}, None])
def test_no_pod_failure_policy_counts_every_failed_pod(chart: helm.Chart, none: Any) -> None:
    # Not {}: Helm merges an empty map into the default policy, leaving it as it is.
    assert "podFailurePolicy" in batch_job(render(chart, tagged({"batch": BATCH})))
    spec = batch_job(render(chart, tagged({"batch": BATCH | {"podFailurePolicy": none}})))
    assert "podFailurePolicy" not in spec


def test_one_completion_runs_the_whole_input_without_shards(chart: helm.Chart) -> None:
    values = tagged({"batch": BATCH | {"completions": 1, "parallelism": 1}})
    (container,) = batch_job(render(chart, values))["template"]["spec"]["containers"]
    assert container["args"] == BATCH["args"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_a_schedule_makes_it_a_cronjob_running_the_same_job(
    chart: helm.Chart, kube_version: str
) -> None:
    scheduled = BATCH | {"schedule": "0 2 * * *", "timeZone": "Europe/Berlin"}
    docs = render(chart, tagged({"batch": scheduled}))
    validate(docs, kube_version)
    assert "Job" not in {d["kind"] for d in docs}
    cronjob = find(docs, "CronJob", "batch")
    assert cronjob["spec"]["schedule"] == "0 2 * * *"
    assert cronjob["spec"]["timeZone"] == "Europe/Berlin"
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    # The CronJob's Jobs are its own to delete; Helm never recreates them.
    cron_spec = batch_job(docs)
    assert cron_spec.pop("ttlSecondsAfterFinished") == 86400
    assert cron_spec == batch_job(render(chart, tagged({"batch": BATCH})))


@pytest.mark.parametrize("schedule", ["", "@daily"])
def test_batch_pods_have_no_nginx_no_ports_and_no_probes(chart: helm.Chart, schedule: str) -> None:
    docs = render(chart, tagged({"batch": BATCH | {"schedule": schedule}}))
    pod = batch_job(docs)["template"]
    assert [c["name"] for c in pod["spec"]["containers"]] == ["batch"]
    (container,) = pod["spec"]["containers"]
    assert not {"ports", "startupProbe", "readinessProbe", "livenessProbe"} & set(container)
    # No Service, disruption budget or network policy selects them.
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "batch"
    for service in (d for d in docs if d["kind"] == "Service"):
        assert not service["spec"]["selector"].items() <= labels.items()


def test_batch_runs_the_servers_image_handler_and_settings(chart: helm.Chart) -> None:
    values = tagged(
        {
            "serving": {
                "handler": "handlers/other/handler.py",
                "device": "cuda",
                "dtype": "float16",
                "cacheUrlSecret": CACHE_SECRET,
            },
            "batch": BATCH,
        }
    )
    docs = render(chart, values)
    app = containers(find(docs, "Deployment"))["app"]
    (batch,) = batch_job(docs)["template"]["spec"]["containers"]
    assert batch["image"] == app["image"]
    # The same environment, less gunicorn's socket, which nothing serves here.
    assert batch["env"] == [e for e in app["env"] if e["name"] != "SERVING_BIND"]
    assert env_of(batch)["SERVING_HANDLER"] == "handlers/other/handler.py"
    assert batch["resources"] == app["resources"]
    assert batch["securityContext"] == app["securityContext"]


def test_batch_resources_override_the_servers(chart: helm.Chart) -> None:
    resources = {"requests": {"cpu": "8", "memory": "4Gi"}, "limits": {"cpu": "8", "memory": "6Gi"}}
    values = tagged({"batch": BATCH | {"resources": resources}})
    (batch,) = batch_job(render(chart, values))["template"]["spec"]["containers"]
    assert batch["resources"] == resources


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_batch_pods_take_the_pod_knobs(chart: helm.Chart, kube_version: str) -> None:
    output = {"name": "output", "persistentVolumeClaim": {"claimName": "batch-output"}}
    output_mount = {"name": "output", "mountPath": "/data"}
    values = POD_KNOBS | {
        "batch": BATCH | {"extraVolumes": [output], "extraVolumeMounts": [output_mount]}
    }
    docs = render(chart, values)
    validate(docs, kube_version)
    pod = batch_job(docs)["template"]
    for key in ("nodeSelector", "tolerations", "affinity", "runtimeClassName", "priorityClassName"):
        assert pod["spec"][key] == POD_KNOBS[key], key
    assert pod["metadata"]["annotations"] == POD_KNOBS["podAnnotations"]
    (batch,) = pod["spec"]["containers"]
    assert batch["env"][-2:] == POD_KNOBS["extraEnv"]
    assert pod["spec"]["volumes"][-2:] == [*POD_KNOBS["extraVolumes"], output]
    assert batch["volumeMounts"][-2:] == [*POD_KNOBS["extraVolumeMounts"], output_mount]
    # The batch pods' own volumes stay out of the server pods.
    assert output not in pod_spec(docs)["volumes"]


def test_batch_writes_only_to_emptydirs_and_volumes_it_is_given(chart: helm.Chart) -> None:
    docs = render(chart, tagged({"batch": BATCH}))
    pod = batch_job(docs)["template"]["spec"]
    (batch,) = pod["containers"]
    assert batch["securityContext"]["readOnlyRootFilesystem"] is True
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    writable = {m["mountPath"] for m in batch["volumeMounts"] if m["name"] in empty_dirs}
    assert writable == {"/tmp", env_of(batch)["SERVING_METRICS_DIR"]}


def test_the_job_is_named_after_its_run_and_only_a_new_run_renames_it(chart: helm.Chart) -> None:
    def job_name(values: dict[str, Any]) -> str:
        return find(render(chart, tagged(values)), "Job", "batch")["metadata"]["name"]  # type: ignore[no-any-return]

    # `helm upgrade` with the same run renders the same Job, which Helm then
    # leaves as it is (finished or not): the run is not started again.
    name = job_name({"batch": BATCH})
    assert job_name({"batch": BATCH}) == name
    assert job_name({"batch": BATCH, "replicaCount": 5}) == name
    # A Job's pod template is immutable: a changed run is a new Job ...
    assert (
        job_name({"batch": BATCH | {"args": ["--input", "a.jsonl", "--output", "b.jsonl"]}}) != name
    )
    assert job_name({"batch": BATCH, "image": {"tag": "1.2.3"}}) != name
    # ... and so is the same run asked for again, under a new runId.
    rerun = job_name({"batch": BATCH | {"runId": "2026-12-01"}})
    assert rerun != name
    assert job_name({"batch": BATCH | {"runId": "2026-12-01"}}) == rerun
    assert job_name({"batch": BATCH | {"runId": "2026-12-02"}}) not in (name, rerun)


@pytest.mark.parametrize("schedule", ["", "@hourly"])
def test_batch_names_fit_what_kubernetes_allows(chart: helm.Chart, schedule: str) -> None:
    # A CronJob's name leaves room for its Jobs' 11-character suffix.
    values = tagged({"batch": BATCH | {"schedule": schedule}})
    docs = render(chart, values, name="a-very-long-release-name-for-a-sentence-embedding-service")
    (doc,) = [d for d in docs if d["kind"] in ("Job", "CronJob")]
    assert len(doc["metadata"]["name"]) <= 52


def test_batch_example_is_a_nightly_cronjob_of_four_shards_writing_to_a_volume(
    chart: helm.Chart,
) -> None:
    docs = render(chart, VALUE_SETS["values-batch"])
    cronjob = find(docs, "CronJob", "batch")
    assert cronjob["spec"]["schedule"] == "0 2 * * *"
    spec = batch_job(docs)
    assert (spec["completions"], spec["parallelism"]) == (4, 4)
    (batch,) = spec["template"]["spec"]["containers"]
    assert batch["args"][-2:] == ["--shards", "4"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in spec["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    mounts = {m["name"]: m["mountPath"] for m in batch["volumeMounts"]}
    output = batch["args"][batch["args"].index("--output") + 1]
    assert any(output.startswith(mounts[name] + "/") for name in claims)


def test_the_batch_command_takes_the_flags_the_chart_passes() -> None:
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit):
        serving_core_main(["batch", "--help"])
    for flag in ("--input", "--output", "--shards"):
        assert flag in help_text.getvalue(), flag
