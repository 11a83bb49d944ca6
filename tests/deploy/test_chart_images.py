"""The images the chart runs: the tags image.yml pushes (the in-repo chart refuses
an empty one, a packaged chart takes its appVersion), digests, and Bitnami's global
registry and pull secrets."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterator

import helm_python as helm
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    EMPTY_TAG_MESSAGE,
    TAG,
    containers,
    env_of,
    find,
    lint_errors,
    pod_specs,
    render,
    tagged,
)


def test_serving_handler_overrides_the_images_handler_only_when_set(chart: helm.Chart) -> None:
    values = tagged({"serving": {"handler": "handlers/other/handler.py"}})
    app = containers(find(render(chart, values), "Deployment"))["app"]
    assert env_of(app)["SERVING_HANDLER"] == "handlers/other/handler.py"


def test_the_in_repo_chart_refuses_an_empty_tag_saying_which_tags_exist(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(EMPTY_TAG_MESSAGE)):
        chart.render({}, name="demo", namespace="serving")
    # `helm lint` only logs a `fail` (Helm's lint mode), so linting the bare
    # chart, as chart.yml does, stays green; install and template refuse.
    assert lint_errors({}) == []


@pytest.fixture(scope="module")
def packaged_chart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[helm.Chart]:
    """The chart as chart.yml packages it for tag v1.2.3: `helm package --app-version 1.2.3`."""
    copied = tmp_path_factory.mktemp("packaged") / "serving-core"
    shutil.copytree(CHART, copied)
    metadata = yaml.safe_load((copied / "Chart.yaml").read_text())
    metadata["appVersion"] = "1.2.3"
    (copied / "Chart.yaml").write_text(yaml.safe_dump(metadata))
    with helm.Chart.load(copied) as loaded:
        yield loaded


def test_the_packaged_chart_deploys_its_release_with_an_empty_tag(
    packaged_chart: helm.Chart,
) -> None:
    by_name = containers(find(render(packaged_chart, {}), "Deployment"))
    assert by_name["app"]["image"] == "ghcr.io/your-org/serving-core:1.2.3"
    assert by_name["nginx"]["image"] == "ghcr.io/your-org/serving-core-nginx:1.2.3"


def test_a_digest_pins_the_images(chart: helm.Chart) -> None:
    digest = "sha256:" + hashlib.sha256(b"image").hexdigest()
    values = {"image": {"tag": "1.0.0", "digest": digest}, "nginx": {"image": {"digest": digest}}}
    by_name = containers(find(render(chart, values), "Deployment"))
    assert by_name["app"]["image"] == f"ghcr.io/your-org/serving-core:1.0.0@{digest}"
    assert by_name["nginx"]["image"] == f"ghcr.io/your-org/serving-core-nginx:1.0.0@{digest}"


def test_digests_alone_deploy_without_the_placeholder_tag(chart: helm.Chart) -> None:
    digest = "sha256:" + hashlib.sha256(b"image").hexdigest()
    values = {"image": {"digest": digest}, "nginx": {"image": {"digest": digest}}}
    by_name = containers(find(render(chart, values), "Deployment"))
    assert by_name["app"]["image"] == f"ghcr.io/your-org/serving-core@{digest}"
    assert by_name["nginx"]["image"] == f"ghcr.io/your-org/serving-core-nginx@{digest}"


# --- global values, as Bitnami charts read them ---------------------------------

EVERY_POD = {
    "batch": {"enabled": True, "args": ["--input", "a", "--output", "b"]},
    "worker": {"enabled": True},
    "serving": {"jobsUrl": "redis://redis.queue.svc:6379/0"},
}


@pytest.mark.parametrize(
    ("repository", "registry", "expected"),
    [
        ("ghcr.io/acme/app", "mirror.example.com", "mirror.example.com/acme/app"),
        ("ghcr.io/acme/app", "mirror.example.com/ghcr/", "mirror.example.com/ghcr/acme/app"),
        ("localhost:5000/app", "mirror.example.com", "mirror.example.com/app"),
        # A Docker Hub path has no registry of its own: the mirror goes in front.
        ("acme/app", "mirror.example.com", "mirror.example.com/acme/app"),
    ],
)
def test_global_image_registry_replaces_the_registry_of_every_image(
    chart: helm.Chart, repository: str, registry: str, expected: str
) -> None:
    values = tagged({"image": {"repository": repository}, "global": {"imageRegistry": registry}})
    docs = render(chart, values | EVERY_POD)
    images = {c["image"] for spec in pod_specs(docs) for c in spec["containers"]}
    assert images == {f"{expected}:{TAG}", f"{expected}-nginx:{TAG}"}
    assert len(pod_specs(docs)) == 4  # server, worker, batch, helm test


def test_global_pull_secrets_join_the_pods_in_every_pod(chart: helm.Chart) -> None:
    values = tagged(
        {
            "global": {"imagePullSecrets": ["mirror", {"name": "ghcr"}]},
            "imagePullSecrets": [{"name": "ghcr"}, {"name": "own"}],
        }
    )
    specs = pod_specs(render(chart, values | EVERY_POD))
    assert len(specs) == 4
    for spec in specs:
        assert spec["imagePullSecrets"] == [{"name": "mirror"}, {"name": "ghcr"}, {"name": "own"}]
    for spec in pod_specs(render(chart, tagged({}) | EVERY_POD)):
        assert "imagePullSecrets" not in spec
