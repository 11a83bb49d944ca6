"""The template as its new owner makes it theirs, done literally on a fresh clone.

README, "Your model": ``serving-core init sentiment``, the README's own handler
code over a scikit-learn model committed beside it, ``HANDLER_DIR:
handlers/sentiment`` in image.yml, ``git rm -r`` of every example handler, then
``make test``. That inner ``make test`` must pass as it is, and its container
tests build the image of ``handlers/sentiment`` and serve its ``sample.json``
through nginx.

The clone is a new repository holding what ``git`` would commit of this working
tree (tracked and untracked-not-ignored files), so a run before a commit tests
that commit. This is a test of the template itself: in a repository its owner
has made theirs, there is nothing left to make theirs, so it is not part of
their ``make test``. The inner run makes its own ``.venv`` (no torch: the examples that
need it are gone) and shares the container engine's image store, so the base
images and the framework's layers come from its cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.readme import block_with, commands, put_the_readme_handler, shell_blocks
from tests.servers import ROOT, git_ls_files

# Apart from `make test` (pyproject's addopts leave it out): it runs the whole
# suite once more, in the clone, which would double the suite's time. CI runs
# it after `make test` (.ci/run); `make test-template` runs it alone.
pytestmark = [pytest.mark.e2e, pytest.mark.template, pytest.mark.timeout(2400)]

# Set in the inner run, whose own copy of this test would start a third.
INSIDE = "TEMPLATE_TEST_INSIDE_CLONE"  # not SERVING_*: the app refuses unknown ones
SERVING_CORE = Path(sys.executable).parent / "serving-core"
NAME = "sentiment"


def readme_says(command: str) -> None:
    """The step this test runs is the one the README tells a user to run."""
    assert any(command in b.text for b in shell_blocks()), f"README.md does not say {command!r}"


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-c", "user.name=New Owner", "-c", "user.email=owner@example.com", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, f"git {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def fresh_clone(into: Path) -> Path:
    """A new repository with this working tree's committable files, modes kept."""
    for name in git_ls_files("--cached", "--others", "--exclude-standard"):
        source = ROOT / name
        # A tracked file deleted in the working tree is left out; a link stays a link.
        if source.is_file() or source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name, follow_symlinks=False)
    git(into, "init", "-q", "-b", "main")
    git(into, "add", "-A")
    git(into, "commit", "-q", "-m", "the template, as cloned")
    return into


def inner_env() -> dict[str, str]:
    # Not the outer make's flags or the outer venv: the clone's make test decides.
    dropped = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV", "PYTEST_ADDOPTS"}
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("SERVING_")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))
    )
    # -rA: the summary names every test that passed, which the asserts below read.
    env |= {INSIDE: "1", "PYTEST_ADDOPTS": "-rA -p no:cacheprovider"}
    return env


def test_a_fresh_clone_with_only_the_owners_handler_passes_make_test(tmp_path: Path) -> None:
    if os.environ.get(INSIDE):
        pytest.skip("this is the fresh clone's own make test")
    repo = fresh_clone(tmp_path / "repo")

    # 1. serving-core init sentiment
    readme_says(f"serving-core init {NAME}")
    init = subprocess.run(
        [str(SERVING_CORE), "init", NAME], cwd=repo, capture_output=True, text=True, check=False
    )
    assert init.returncode == 0, init.stdout + init.stderr
    folder = repo / "handlers" / NAME

    # 2. the model, the README's handler code over it, its requirements and a sample
    put_the_readme_handler(folder)
    (folder / "sample.json").write_text(json.dumps({"text": "a wonderful, excellent day"}))

    # 5. the README's own lines: image.yml's HANDLER_DIR, every example removed
    step5 = block_with(f"HANDLER_DIR: handlers/{NAME}")
    lines = commands(step5.text)
    assert lines[-1] == "make test", lines
    for line in lines[:-1]:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line],
            cwd=repo,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    assert f"HANDLER_DIR: handlers/{NAME}" in (repo / ".github/workflows/image.yml").read_text()
    git(repo, "commit", "-q", "-m", f"serve handlers/{NAME} alone")
    assert sorted(p.name for p in (repo / "handlers").iterdir()) == [NAME]
    assert git(repo, "status", "--porcelain") == "", "the model file is committed with the rest"

    # make test, as the README's quick start and CI run it.
    result = subprocess.run(
        ["make", "--no-print-directory", "test"],
        cwd=repo,
        env=inner_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=2100,
    )
    output = result.stdout
    (tmp_path / "make-test.log").write_text(output)
    assert result.returncode == 0, output[-20000:]
    summary = output.splitlines()[-1]
    assert re.search(r"\d+ passed", summary), summary
    assert "failed" not in summary, summary
    assert f"serving-core check handlers/{NAME}" in output
    # The image of handlers/sentiment was built and served its sample through nginx.
    stack = [line for line in output.splitlines() if "tests/container/test_stack.py" in line]
    assert any(line.startswith("PASSED") and "sample" in line for line in stack), (
        "\n".join(stack) or output[-20000:]
    )
    assert not [line for line in stack if line.startswith(("FAILED", "ERROR"))], stack
    # Only the MiniLM example's own check may skip: nothing for want of an engine.
    skipped = [line for line in stack if line.startswith("SKIPPED")]
    assert all(f"serves handlers/{NAME}, not handlers/minilm" in line for line in skipped), skipped
