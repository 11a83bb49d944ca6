"""The chart README's Parameters tables are generated: readme-generator-for-helm
(`make chart-docs`, the version tools/chart-docs/package-lock.json pins) run on a
copy of the chart leaves the README as it is, and it refuses a value without its
`## @param` comment."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.workflows import ROOT

CHART = ROOT / "helm" / "serving-core"
GENERATOR = ROOT / "tools" / "chart-docs" / "node_modules" / ".bin" / "readme-generator"


def generate(chart: Path) -> subprocess.CompletedProcess[str]:
    if not GENERATOR.exists():
        pytest.fail(f"{GENERATOR} is missing: `make chart-docs-tools` installs it (node and npm)")
    return subprocess.run(
        [
            str(GENERATOR),
            *("--values", str(chart / "values.yaml")),
            *("--readme", str(chart / "README.md")),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    for name in ("values.yaml", "README.md"):
        shutil.copy2(CHART / name, tmp_path / name)
    return tmp_path


def test_the_readme_is_what_the_generator_makes_of_values_yaml(copy: Path) -> None:
    result = generate(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (copy / "README.md").read_text() == (CHART / "README.md").read_text(), (
        "helm/serving-core/README.md is not what values.yaml's comments generate: "
        "run `make chart-docs`"
    )


def test_a_changed_description_changes_the_table(copy: Path) -> None:
    # Proof that the comparison above has teeth: the table follows the comment.
    values = copy / "values.yaml"
    text = values.read_text()
    assert "## @param replicaCount Pods of the server Deployment" in text
    old, new = "## @param replicaCount Pods", "## @param replicaCount All pods"
    values.write_text(text.replace(old, new))
    assert generate(copy).returncode == 0
    readme = (copy / "README.md").read_text()
    assert "All pods of the server Deployment" in readme
    assert readme != (CHART / "README.md").read_text()


def test_a_value_without_its_param_comment_fails_naming_it(copy: Path) -> None:
    values = copy / "values.yaml"
    values.write_text(values.read_text() + "undocumentedKnob: 1\n")
    result = generate(copy)
    assert result.returncode != 0
    assert "undocumentedKnob" in result.stdout + result.stderr
