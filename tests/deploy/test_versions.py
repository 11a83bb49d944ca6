"""The framework's one version, wherever it is read: pyproject.toml, the newest
released entry of CHANGELOG.md (the tag `vX.Y.Z` it is released as), `serving-core
--version`, and the label both images carry. `make upgrade` reads pyproject's to
know which tag a repository was made from (docs/upgrading.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVING_CORE = Path(sys.executable).parent / "serving-core"


def pyproject_version() -> str:
    (found,) = re.findall(
        r'(?m)^version = "(\d+\.\d+\.\d+)"$', (ROOT / "pyproject.toml").read_text()
    )
    return found


def test_the_newest_release_in_the_changelog_is_pyprojects_version() -> None:
    headings = re.findall(r"(?m)^## (\S+)", (ROOT / "CHANGELOG.md").read_text())
    released = [h for h in headings if h != "Unreleased"]
    assert headings[0] in ("Unreleased", pyproject_version()), headings
    assert released[0] == pyproject_version(), headings


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "nginx/Dockerfile"])
def test_each_image_labels_the_framework_version(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    assert f"ARG FRAMEWORK_VERSION={pyproject_version()}\n" in text
    assert 'io.github.serving-core.version="${FRAMEWORK_VERSION}"' in text


def test_serving_core_version_prints_it() -> None:
    done = subprocess.run(
        [str(SERVING_CORE), "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["serving-core", pyproject_version()]
