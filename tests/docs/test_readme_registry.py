"""The registry names in the docs are the ones image.yml pushes, and the docs say how a
private GHCR package is pulled: README.md, docs/, the chart's README, values and examples,
and the NOTES the chart prints after an install."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.chart import CHART, EXAMPLES, TAG, VALUE_SETS, chart, find, render
from tests.servers import ROOT

__all__ = ["chart"]  # the fixture, shared with tests/deploy (tests/deploy/chart.py)

WORKFLOW = ROOT / ".github" / "workflows" / "image.yml"
KUBERNETES = ROOT / "docs" / "deployment" / "kubernetes.md"
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    CHART / "README.md",
    CHART / "values.yaml",
    *EXAMPLES,
]
REFERENCE = re.compile(r"ghcr\.io/[^\s`'\")\]}|]+")
# What image.yml pushes, with GitHub's owner and repository lower-cased (`,,`):
# <owner>/<repo> and <owner>/<repo>-nginx, and the chart under <owner>/<repo>/charts
# (named after the repository: two repositories of one owner keep their own charts).
NAME = r"(?:<owner>|[a-z0-9][a-z0-9-]*)"
REPO = r"(?:<repo>|[a-z0-9][a-z0-9._-]*)"
PUSHED = re.compile(rf"ghcr\.io/{NAME}/{REPO}(?:/charts/serving-core|/charts|-nginx)?")


def image_name(reference: str) -> str:
    """The repository part: no tag, digest or trailing punctuation."""
    name = reference.rstrip(".,:;")
    name = name.split("@", 1)[0]
    head, _, tail = name.rpartition(":")
    return head if head and "/" not in tail else name


def hand_built() -> list[re.Pattern[str]]:
    """Images the examples build by hand (``docker build -t``), not image.yml: the iris
    pipeline's four, whose `$name` stands for each classifier."""
    names = set()
    for path in EXAMPLES:
        names |= set(re.findall(r"docker build -t (ghcr\.io/\S+?)(?::\S+)? ", path.read_text()))
    return [re.compile(re.escape(n).replace(r"\$name", "[a-z0-9$-]+") + "$") for n in names]


def test_image_yml_pushes_the_names_the_docs_use() -> None:
    workflow = WORKFLOW.read_text()
    assert 'app="ghcr.io/${GITHUB_REPOSITORY,,}"' in workflow
    assert 'echo "nginx=${app}-nginx"' in workflow
    assert 'oci://ghcr.io/${GITHUB_REPOSITORY,,}/charts"' in workflow


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_ghcr_name_in_the_docs_is_one_image_yml_pushes_or_one_built_by_hand(
    path: Path,
) -> None:
    built = hand_built()
    wrong = [
        name
        for name in map(image_name, REFERENCE.findall(path.read_text()))
        if not PUSHED.fullmatch(name) and not any(b.match(name) for b in built)
    ]
    assert not wrong, (
        f"{wrong}: image.yml pushes ghcr.io/<owner>/<repo> and ghcr.io/<owner>/<repo>-nginx, "
        "lower-cased, and the chart to oci://ghcr.io/<owner>/<repo>/charts/serving-core"
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_an_examples_nginx_image_is_its_app_images_twin_or_built_by_hand(
    chart: helm.Chart, example: Path
) -> None:
    values: dict[str, Any] = {"image": {"tag": TAG}, **VALUE_SETS[example.stem]}
    values["image"] = {"tag": TAG, **values["image"]}
    containers = find(render(chart, values), "Deployment")["spec"]["template"]["spec"]
    images = {c["name"]: image_name(c["image"]) for c in containers["containers"]}
    twin = images["nginx"] == images["app"] + "-nginx"
    assert twin or any(b.match(images["nginx"]) for b in hand_built()), images


def test_the_readme_says_what_image_yml_pushes() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    for name in (
        "ghcr.io/<owner>/<repo>",
        "ghcr.io/<owner>/<repo>-nginx",
        "oci://ghcr.io/<owner>/<repo>/charts/serving-core",
        "docs/deployment/kubernetes.md#install-with-helm",
    ):
        assert name in text, name


def test_the_kubernetes_page_says_how_a_private_package_is_pulled() -> None:
    text = " ".join(KUBERNETES.read_text().split())
    for name in (
        "oci://ghcr.io/<owner>/<repo>/charts/serving-core",
        "helm registry login ghcr.io",
        "kubectl create secret docker-registry ghcr",
        "imagePullSecrets",
        "New GHCR packages are **private**",
    ):
        assert name in text, name


def notes(chart: helm.Chart, values: dict[str, Any]) -> str:
    rendered = chart.render(values, name="demo", namespace="serving")
    return str(rendered["serving-core/templates/NOTES.txt"])


@pytest.mark.parametrize("name", ["default", *sorted(VALUE_SETS)])
def test_the_notes_send_a_sample_path_and_name_pushed_images(chart: helm.Chart, name: str) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text()) if name == "default" else {}
    values = {**values, **VALUE_SETS.get(name, {})}
    values["image"] = {**values.get("image", {}), "tag": values.get("image", {}).get("tag") or TAG}
    text = notes(chart, values)
    assert "@sample.json" not in text  # a path that works only from the handler's folder
    assert re.search(r"-d @handlers/[^ ]+/sample\.json", text), text
    built = hand_built()
    for ref in map(image_name, REFERENCE.findall(text)):
        assert PUSHED.fullmatch(ref) or any(b.match(ref) for b in built), ref


def test_the_notes_say_how_to_pull_a_private_ghcr_image_until_a_pull_secret_is_set(
    chart: helm.Chart,
) -> None:
    values = {"image": {"repository": "ghcr.io/acme/sentiment", "tag": TAG}}
    text = notes(chart, values)
    assert "a new package is private" in text
    assert "ghcr.io/acme/sentiment and ghcr.io/acme/sentiment-nginx" in " ".join(text.split())
    assert "kubectl --namespace serving create secret docker-registry ghcr" in text
    assert "--set 'imagePullSecrets[0].name=ghcr'" in text
    with_secret = notes(chart, {**values, "imagePullSecrets": [{"name": "ghcr"}]})
    assert "private" not in with_secret
    elsewhere = notes(chart, {"image": {"repository": "registry.example.com/m", "tag": TAG}})
    assert "private" not in elsewhere


def test_the_notes_name_the_sample_of_the_handler_the_values_set(chart: helm.Chart) -> None:
    for handler, sample in (
        ("handlers/foo/handler.py", "handlers/foo/sample.json"),
        ("handlers/foo", "handlers/foo/sample.json"),
        ("", "handlers/<name>/sample.json"),
    ):
        values = {"image": {"tag": TAG}, "serving": {"handler": handler}}
        assert f"-d @{sample}\n" in notes(chart, values), handler
