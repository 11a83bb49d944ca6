"""The template as its new owner makes it theirs, done literally on a fresh clone.

README, "Your model": ``serving-core init sentiment``, the README's own handler
code over a scikit-learn model committed beside it, ``HANDLER_DIR:
handlers/sentiment`` in image.yml, ``git rm -r`` of every example handler, then
``make test``. That inner ``make test`` must pass as it is, and its container
tests build the image of ``handlers/sentiment`` and serve its ``sample.json``
through nginx.

The clone is a new repository holding what ``git`` would commit of this working
tree (tracked and untracked-not-ignored files), so a run before a commit tests
that commit. The inner run makes its own ``.venv`` (no torch: the examples that
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

from tests.servers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

# Set in the inner run, whose own copy of this test would start a third.
INSIDE = "SERVING_TEST_FRESH_CLONE"
README = ROOT / "README.md"
SERVING_CORE = Path(sys.executable).parent / "serving-core"
NAME = "sentiment"


def readme_blocks(language: str) -> list[str]:
    text = README.read_text()
    return re.findall(rf"^ *```{language}[^\n]*\n(.*?)^ *```", text, re.MULTILINE | re.DOTALL)


def readme_handler() -> str:
    """The handler code the README gives in "Your model", as a user pastes it."""
    found = [b for b in readme_blocks("python") if f"class {NAME.title()}(Handler)" in b]
    assert len(found) == 1, f"README.md has {len(found)} python blocks defining {NAME.title()}"
    lines = found[0].splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


def readme_says(command: str) -> None:
    """The step this test runs is the one the README tells a user to run."""
    shell = "\n".join(readme_blocks("bash") + readme_blocks("sh") + readme_blocks("console"))
    prose = README.read_text()
    assert command in shell or f"`{command}`" in prose, f"README.md does not say `{command}`"


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
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    git(into, "init", "-q", "-b", "main")
    git(into, "add", "-A")
    git(into, "commit", "-q", "-m", "the template, as cloned")
    return into


def train_model(path: Path) -> None:
    """What the user saves beside handler.py: a small text classifier."""
    import joblib
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    positive = ["I love it", "great service", "a wonderful day", "excellent and fast"]
    negative = ["I hate it", "terrible service", "an awful day", "slow and broken"]
    model = make_pipeline(TfidfVectorizer(), LogisticRegression(C=10.0))
    model.fit(positive + negative, [1] * len(positive) + [0] * len(negative))
    joblib.dump(model, path)


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
    examples = sorted(p.name for p in (repo / "handlers").iterdir() if p.is_dir())

    # 1. serving-core init sentiment
    readme_says(f"serving-core init {NAME}")
    init = subprocess.run(
        [str(SERVING_CORE), "init", NAME], cwd=repo, capture_output=True, text=True, check=False
    )
    assert init.returncode == 0, init.stdout + init.stderr
    folder = repo / "handlers" / NAME

    # 2. the model, the README's handler code over it, its requirements and a sample
    train_model(folder / "model.joblib")
    (folder / "handler.py").write_text(readme_handler())
    (folder / "requirements.txt").write_text("scikit-learn\njoblib\n")
    (folder / "sample.json").write_text(json.dumps({"text": "a wonderful, excellent day"}))

    # 5. HANDLER_DIR: handlers/sentiment in image.yml
    workflow = repo / ".github" / "workflows" / "image.yml"
    text, count = re.subn(
        r"^  HANDLER_DIR: .*$",
        f"  HANDLER_DIR: handlers/{NAME}",
        workflow.read_text(),
        flags=re.MULTILINE,
    )
    assert count == 1, "image.yml has no `  HANDLER_DIR:` line under env"
    workflow.write_text(text)

    # ... and every example handler removed, all of it committed (the model too).
    readme_says("git rm -r")
    git(repo, "rm", "-r", "-q", *(f"handlers/{name}" for name in examples))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"serve handlers/{NAME} alone")
    assert sorted(p.name for p in (repo / "handlers").iterdir()) == [NAME]

    # make test, as the README's quick start and CI run it.
    readme_says("make test")
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
    assert not [line for line in stack if line.startswith(("SKIPPED", "FAILED", "ERROR"))], stack
