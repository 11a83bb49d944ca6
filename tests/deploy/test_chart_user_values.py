"""The chart with a template user's own values, the part of ``make check`` that is theirs.

``make check`` sets ``CHART_VALUES`` to the file deploy.yml deploys (the Makefile
says which); unset, as in the framework's suite, it is that file's default. The
file lints strictly and renders manifests valid for the oldest and newest
Kubernetes the chart supports, with the image tag image.yml pushes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.chart import CHART, KUBE_VERSIONS, ROOT, lint_errors, render, tagged, validate

DEFAULT = CHART / "examples" / "values-default.yaml"


def user_values() -> tuple[Path, dict[str, Any]]:
    path = Path(os.environ.get("CHART_VALUES") or DEFAULT)
    path = path if path.is_absolute() else ROOT / path
    assert path.is_file(), f"CHART_VALUES={path} is not a file; name your values file"
    values = yaml.safe_load(path.read_text()) or {}
    assert isinstance(values, dict), f"{path}: a values file is a mapping of values"
    return path, tagged(values)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_users_values_lint_strictly(kube_version: str) -> None:
    path, values = user_values()
    assert lint_errors(values, kube_version) == [], path


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_users_values_render_valid_kubernetes(chart: helm.Chart, kube_version: str) -> None:
    _, values = user_values()
    docs = render(chart, values)
    assert {"Deployment", "Service"} <= {d["kind"] for d in docs}
    validate(docs, kube_version)


def test_a_values_file_the_chart_refuses_fails_the_check(tmp_path: Path) -> None:
    # Proof that the check has teeth: a value the schema does not know.
    bad = tmp_path / "values.yaml"
    bad.write_text("replicaCount: 1\nnoSuchValue: true\n")
    values = tagged(yaml.safe_load(bad.read_text()))
    assert lint_errors(values, KUBE_VERSIONS[-1]) != []
