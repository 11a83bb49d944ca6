"""The model's artifacts from a store (model.*): every pod that loads the handler runs
`serving-core fetch` as an init container into the model volume, with the store's
credentials from a Secret or the ServiceAccount; its serving-core containers read that
copy offline, read-only, without the credentials. Bad combinations are refused."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest

from serving_core.settings import Settings
from tests.deploy.chart import (
    BATCH,
    KUBE_VERSIONS,
    QUEUE_URL,
    env_of,
    find,
    pod_specs,
    render,
    serving_env,
    tagged,
    validate,
)

URI = "s3://models/minilm/v2/"
CACHE = "/var/cache/serving-core/models"
STREAM = {
    "enabled": True,
    "source": "redis://redis.stream.svc:6379/0?stream=sentences&group=serving-core",
    "sink": "redis://redis.stream.svc:6379/0?stream=embeddings",
    "deadLetter": "redis://redis.stream.svc:6379/0?stream=dead",
}
# Every kind of pod that loads the handler: server, worker, stream and batch.
EVERY_POD: dict[str, Any] = {
    "serving": {"jobsUrl": QUEUE_URL},
    "worker": {"enabled": True},
    "stream": STREAM,
    "batch": BATCH,
}
LOADERS = {"app", "worker", "stream", "batch"}
S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "access-key-id",
    "AWS_SECRET_ACCESS_KEY": "secret-access-key",
}


def with_model(model: dict[str, Any], **more: Any) -> dict[str, Any]:
    return tagged({"model": {"uri": URI, **model}, **EVERY_POD, **more})


def pods(values: dict[str, Any], chart: helm.Chart) -> list[dict[str, Any]]:
    """The spec of every pod that loads the handler (the helm test pod does not)."""
    specs = pod_specs(render(chart, values))
    loading = [s for s in specs if {c["name"] for c in s["containers"]} & LOADERS]
    assert len(loading) == 4, [[c["name"] for c in s["containers"]] for s in specs]
    return loading


def loader(spec: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in spec["containers"] if c["name"] in LOADERS]
    return container  # type: ignore[no-any-return]


def fetcher(spec: dict[str, Any]) -> dict[str, Any]:
    (init,) = spec["initContainers"]
    assert init["name"] == "fetch-model"
    return init  # type: ignore[no-any-return]


def volume(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in spec["volumes"] if v["name"] == name]
    return found  # type: ignore[no-any-return]


# --- the init container and the volume -------------------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_pod_that_loads_the_handler_fetches_first(
    chart: helm.Chart, kube_version: str
) -> None:
    values = with_model({"volume": {"sizeLimit": "4Gi"}})
    validate(render(chart, values), kube_version)
    app_container = loader(find(render(chart, values), "Deployment")["spec"]["template"]["spec"])
    for spec in pods(values, chart):
        init = fetcher(spec)
        assert init["command"] == ["serving-core", "fetch"]
        assert init["image"] == loader(spec)["image"] == app_container["image"]
        env = env_of(init)
        assert (env["SERVING_MODEL_URI"], env["SERVING_MODEL_CACHE"]) == (URI, CACHE)
        # It fetches: it is the one container that asks the store.
        assert "SERVING_MODEL_OFFLINE" not in env
        assert {"name": "model-cache", "mountPath": CACHE} in init["volumeMounts"]
        assert {"name": "tmp", "mountPath": "/tmp"} in init["volumeMounts"]
        assert volume(spec, "model-cache") == {
            "name": "model-cache",
            "emptyDir": {"sizeLimit": "4Gi"},
        }


def test_the_init_container_is_as_locked_down_as_the_app(chart: helm.Chart) -> None:
    for spec in pods(with_model({}), chart):
        init = fetcher(spec)
        assert init["securityContext"] == loader(spec)["securityContext"]
        assert init["securityContext"]["readOnlyRootFilesystem"] is True
        assert init["securityContext"]["allowPrivilegeEscalation"] is False
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        # It writes only to volumes: the model's and /tmp.
        assert {m["name"] for m in init["volumeMounts"]} == {"model-cache", "tmp"}


def test_serving_core_containers_read_the_fetched_copy_offline_and_read_only(
    chart: helm.Chart,
) -> None:
    for spec in pods(with_model({"volume": {"sizeLimit": "4Gi"}}), chart):
        container = loader(spec)
        env = env_of(container)
        assert env["SERVING_MODEL_URI"] == URI
        assert env["SERVING_MODEL_CACHE"] == CACHE
        assert env["SERVING_MODEL_OFFLINE"] == "true"
        mount = {"name": "model-cache", "mountPath": CACHE, "readOnly": True}
        assert mount in container["volumeMounts"], container["name"]
        settings = Settings.from_env(serving_env(container), cores=2)
        assert (settings.model_uri, settings.model_cache) == (URI, CACHE)
        assert settings.model_offline is True


def test_the_init_containers_environment_is_what_serving_core_accepts(
    chart: helm.Chart,
) -> None:
    values = with_model({"credentials": {"secretName": "model-store", "env": S3_KEYS}})
    for spec in pods(values, chart):
        settings = Settings.from_env(serving_env(fetcher(spec)), cores=2)
        assert (settings.model_uri, settings.model_offline) == (URI, False)


def test_an_existing_claim_is_shared_instead_of_an_empty_dir(chart: helm.Chart) -> None:
    values = with_model({"volume": {"claimName": "models"}})
    validate(render(chart, values), "1.33")
    for spec in pods(values, chart):
        assert volume(spec, "model-cache") == {
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": "models"},
        }
        assert any(
            m["readOnly"] for m in loader(spec)["volumeMounts"] if m["name"] == "model-cache"
        )


def test_an_empty_dir_without_a_size_is_the_nodes_ephemeral_storage(chart: helm.Chart) -> None:
    for spec in pods(with_model({}), chart):
        assert volume(spec, "model-cache") == {"name": "model-cache", "emptyDir": {}}


def test_the_mount_path_is_the_cache(chart: helm.Chart) -> None:
    for spec in pods(with_model({"mountPath": "/models"}), chart):
        assert env_of(fetcher(spec))["SERVING_MODEL_CACHE"] == "/models"
        assert env_of(loader(spec))["SERVING_MODEL_CACHE"] == "/models"


def test_the_init_container_takes_the_app_resources_unless_given_its_own(
    chart: helm.Chart,
) -> None:
    (server, *_) = pods(with_model({}), chart)
    assert fetcher(server)["resources"] == loader(server)["resources"]
    own = {"limits": {"cpu": "1", "memory": "512Mi"}}
    for spec in pods(with_model({"resources": own}), chart):
        assert fetcher(spec)["resources"] == own


def test_without_a_uri_nothing_is_fetched(chart: helm.Chart) -> None:
    for spec in pods(tagged(EVERY_POD), chart):
        assert "initContainers" not in spec
        assert "model-cache" not in {v["name"] for v in spec["volumes"]}
        assert not {k for k in env_of(loader(spec)) if k.startswith("SERVING_MODEL_")} - {
            "SERVING_MODEL_PROCESS",
            "SERVING_MODEL_PROCESSES",
        }


@pytest.mark.parametrize("uri", ["/models/minilm", "file:///models/minilm"])
def test_a_path_in_the_image_is_used_in_place(chart: helm.Chart, uri: str) -> None:
    for spec in pods(tagged({"model": {"uri": uri}, **EVERY_POD}), chart):
        assert "initContainers" not in spec
        env = env_of(loader(spec))
        assert env["SERVING_MODEL_URI"] == uri
        assert "SERVING_MODEL_OFFLINE" not in env
        assert "SERVING_MODEL_CACHE" not in env


# --- credentials: a Secret for the init container only, or the ServiceAccount --------


def test_credentials_from_secret_keys_reach_the_init_container_only(chart: helm.Chart) -> None:
    values = with_model(
        {
            "credentials": {"secretName": "model-store", "env": S3_KEYS},
            "extraEnv": [{"name": "AWS_ENDPOINT_URL", "value": "https://minio.storage.svc:9000"}],
        }
    )
    validate(render(chart, values), "1.33")
    for spec in pods(values, chart):
        by_name = {e["name"]: e for e in fetcher(spec)["env"]}
        for variable, key in S3_KEYS.items():
            ref = {"secretKeyRef": {"name": "model-store", "key": key}}
            assert by_name[variable]["valueFrom"] == ref
        assert by_name["AWS_ENDPOINT_URL"]["value"] == "https://minio.storage.svc:9000"
        assert "envFrom" not in fetcher(spec)
        names = {e["name"] for e in loader(spec)["env"]}
        assert not names & {*S3_KEYS, "AWS_ENDPOINT_URL"}


def test_a_whole_secret_becomes_the_init_containers_environment(chart: helm.Chart) -> None:
    values = with_model({"credentials": {"secretName": "model-store"}})
    for spec in pods(values, chart):
        assert fetcher(spec)["envFrom"] == [{"secretRef": {"name": "model-store"}}]
        assert "model-store" not in str(spec["containers"])


def test_a_credentials_file_is_mounted_in_the_init_container_only(chart: helm.Chart) -> None:
    values = with_model(
        {"uri": "gs://models/minilm/", "credentials": {"secretName": "gcp", "fileKey": "key.json"}}
    )
    validate(render(chart, values), "1.33")
    for spec in pods(values, chart):
        init = fetcher(spec)
        path = "/run/model-credentials/key.json"
        assert env_of(init)["GOOGLE_APPLICATION_CREDENTIALS"] == path
        mount = {
            "name": "model-credentials",
            "mountPath": "/run/model-credentials",
            "readOnly": True,
        }
        assert mount in init["volumeMounts"]
        assert volume(spec, "model-credentials")["secret"] == {
            "secretName": "gcp",
            "items": [{"key": "key.json", "path": "key.json"}],
        }
        assert "model-credentials" not in {m["name"] for m in loader(spec)["volumeMounts"]}
        assert "GOOGLE_APPLICATION_CREDENTIALS" not in env_of(loader(spec))


@pytest.mark.parametrize(
    "annotation",
    [
        {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/model-reader"},
        {"iam.gke.io/gcp-service-account": "model-reader@project.iam.gserviceaccount.com"},
    ],
    ids=["irsa", "workload-identity"],
)
def test_credentials_from_the_service_account(
    chart: helm.Chart, annotation: dict[str, str]
) -> None:
    values = with_model({}, serviceAccount={"annotations": annotation})
    docs = render(chart, values)
    validate(docs, "1.33")
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert account["metadata"]["annotations"] == annotation
    for spec in pods(values, chart):
        assert spec["serviceAccountName"] == account["metadata"]["name"]
        init = fetcher(spec)
        assert "envFrom" not in init
        assert not [e for e in init["env"] if "valueFrom" in e]


# --- refusals ---------------------------------------------------------------------

REFUSALS = [
    (
        {
            "model": {"uri": URI},
            "networkPolicy": {"enabled": True},
            "pipeline": {"stageUrls": {"STAGE_URL": "http://stage-serving-core"}},
        },
        "but the init container fetches model.uri (s3://models/minilm/v2/) from its store: add a "
        "rule for it to networkPolicy.egress",
    ),
    (
        {"model": {"uri": URI, "volume": {"sizeLimit": "4Gi", "claimName": "models"}}},
        "model.volume.sizeLimit (4Gi, an emptyDir) and model.volume.claimName (models, a "
        "PersistentVolumeClaim) are both set: keep one",
    ),
    (
        {"model": {"volume": {"claimName": "models"}}},
        "model.volume and model.credentials are for the init container that fetches model.uri",
    ),
    (
        {"model": {"credentials": {"secretName": "model-store"}}},
        "model.volume and model.credentials are for the init container that fetches model.uri",
    ),
    (
        {"model": {"uri": "/models/minilm", "volume": {"sizeLimit": "4Gi"}}},
        "model.uri (/models/minilm) is a path inside the image, used in place",
    ),
    (
        {"model": {"uri": URI, "credentials": {"env": S3_KEYS}}},
        "model.credentials.env and model.credentials.fileKey name keys of a Secret: set "
        "model.credentials.secretName",
    ),
    (
        {
            "model": {
                "uri": URI,
                "credentials": {"secretName": "s", "env": {"SERVING_MODEL_URI": "uri"}},
            }
        },
        "model.credentials.env sets SERVING_MODEL_URI, but SERVING_* names are",
    ),
    (
        {"model": {"uri": URI, "extraEnv": [{"name": "SERVING_MODEL_OFFLINE", "value": "0"}]}},
        "model.extraEnv sets SERVING_MODEL_OFFLINE",
    ),
    (
        {"extraEnv": [{"name": "SERVING_MODEL_URI", "value": URI}]},
        "extraEnv sets SERVING_MODEL_URI, which the chart sets from model.uri",
    ),
    (
        {
            "model": {"uri": URI},
            "extraVolumes": [{"name": "model-cache", "emptyDir": {}}],
        },
        "extraVolumes has a volume named model-cache, which the chart uses for model.uri",
    ),
]


@pytest.mark.parametrize(("values", "message"), REFUSALS)
def test_bad_combinations_are_refused_saying_what_to_change(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(tagged(values), name="demo", namespace="serving")


@pytest.mark.parametrize(
    ("model", "where"),
    [
        ({"uri": "minio/models"}, "/model/uri"),
        ({"volume": {"sizeLimit": "4GB"}}, "/model/volume/sizeLimit"),
        ({"credentials": {"env": {"AWS-KEY": "k"}}}, "/model/credentials/env"),
        ({"volme": {}}, "additional properties 'volme' not allowed"),
    ],
)
def test_the_schema_refuses_bad_model_values(
    chart: helm.Chart, model: dict[str, Any], where: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.render(tagged({"model": model}), name="demo", namespace="serving")
