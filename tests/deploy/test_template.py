"""The template as its new owner makes it theirs, done literally on a fresh clone, and
then upgraded.

An "upstream" repository holds two versions: N, this working tree made older
(framework files changed: the version, the CHANGELOG, a line of image.yml beside
HANDLER_DIR, an example handler, a module of serving_core/), tagged ``v0.0.0``,
and N+1, this working tree as it is, tagged with pyproject's version. The owner's
repository is made from N as GitHub's "Use this template" makes it (a history of
its own). Then README, "Your model": ``serving-core init sentiment``, the
README's own handler code over a scikit-learn model committed beside it,
``HANDLER_DIR: handlers/sentiment`` in image.yml, ``git rm -r`` of every example
handler, then ``make check``, the owner's suite: it must pass as it is, and its
container tests build the image of ``handlers/sentiment`` and serve its
``sample.json`` through nginx. Then the README's ``make upgrade`` (UPSTREAM names
the local upstream, as a mirror would) takes N+1 without a conflict, leaves the
owner's files as they were, brings every framework change, and ``make check``
passes again. Each ``make check``'s time is written to
test-artifacts/template-times.json (the README's "Measured").

This is a test of the template itself: in a repository its owner has made
theirs, there is nothing left to make theirs, so it is not part of their suite.
The inner runs make their own ``.venv`` (no torch: the examples that need it are
gone) and share the container engine's image store, so the base images and the
framework's layers come from its cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.readme import block_with, commands, put_the_readme_handler, shell_blocks
from tests.servers import ROOT, git_ls_files

# Apart from `make test` (pyproject's addopts leave it out): it builds the images
# again, twice, in the clone. CI runs it after `make test` (.ci/run); `make
# test-template` runs it alone.
pytestmark = [pytest.mark.e2e, pytest.mark.template, pytest.mark.timeout(2400)]

# Set in the inner run, whose own copy of this test would start a third.
INSIDE = "TEMPLATE_TEST_INSIDE_CLONE"  # not SERVING_*: the app refuses unknown ones
SERVING_CORE = Path(sys.executable).parent / "serving-core"
NAME = "sentiment"
IMAGE_YML = ".github/workflows/image.yml"
OLDER = "0.0.0"  # version N, the owner's repository's first
TIMES = ROOT / "test-artifacts" / "template-times.json"


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


def put_tree(into: Path) -> None:
    """This working tree's committable files into ``into``, modes kept."""
    for name in git_ls_files("--cached", "--others", "--exclude-standard"):
        source = ROOT / name
        # A tracked file deleted in the working tree is left out; a link stays a link.
        if source.is_file() or source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            (into / name).unlink(missing_ok=True)  # the tree again, over version N's
            shutil.copy2(source, into / name, follow_symlinks=False)


def version() -> str:
    (found,) = re.findall(r'(?m)^version = "(.+)"$', (ROOT / "pyproject.toml").read_text())
    return found


def make_older(tree: Path) -> None:
    """This tree as version N: framework files as they were before N+1 changed them."""

    def edit(name: str, old: str, new: str) -> None:
        path = tree / name
        text = path.read_text()
        assert old in text, f"{name}: {old!r}"
        path.write_text(text.replace(old, new, 1))

    current = version()
    assert current != OLDER
    edit("pyproject.toml", f'version = "{current}"', f'version = "{OLDER}"')
    for dockerfile in ("Dockerfile", "nginx/Dockerfile"):
        edit(dockerfile, f"ARG FRAMEWORK_VERSION={current}", f"ARG FRAMEWORK_VERSION={OLDER}")
    changelog = (tree / "CHANGELOG.md").read_text()
    first, second = (m.start() for m in re.finditer(r"(?m)^## ", changelog))
    (tree / "CHANGELOG.md").write_text(changelog[:first] + f"## {OLDER}\n\n" + changelog[second:])
    # The line right above the owner's HANDLER_DIR: upstream changes it in N+1.
    edit(IMAGE_YML, "\n  HANDLER_DIR:", "\n  # (version N's comment)\n  HANDLER_DIR:")
    # An example the owner deletes, and a module of the package: changed upstream.
    for name in ("handlers/echo/handler.py", "serving_core/commands/check.py"):
        path = tree / name
        path.write_text(path.read_text() + f"# (version N's {path.parent.name})\n")


def new_repo(tree: Path, message: str) -> None:
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", message)


def upstream_of_two_versions(into: Path) -> Path:
    """Upstream: N tagged v0.0.0, then N+1 (this tree) tagged with pyproject's version."""
    into.mkdir()
    put_tree(into)
    make_older(into)
    git(into, "init", "-q", "-b", "main")
    new_repo(into, f"serving-core {OLDER}")
    git(into, "tag", f"v{OLDER}")
    put_tree(into)
    new_repo(into, f"serving-core {version()}")
    git(into, "tag", f"v{version()}")
    return into


def made_from_older(into: Path) -> Path:
    """A repository of the owner's made from N: a history of its own."""
    into.mkdir()
    put_tree(into)
    make_older(into)
    git(into, "init", "-q", "-b", "main")
    new_repo(into, "Initial commit")
    return into


def run_as_written(repo: Path, line: str, env: dict[str, str], log: Path) -> float:
    """One README command line in bash, as a person types it; returns its seconds."""
    started = time.monotonic()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", line],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=2100,
    )
    seconds = time.monotonic() - started
    log.write_text(done.stdout)
    assert done.returncode == 0, f"{line}\n{done.stdout[-20000:]}"
    return seconds


def owners_files(repo: Path) -> dict[str, bytes]:
    folder = repo / "handlers" / NAME
    return {
        str(p.relative_to(repo)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def assert_the_check_passed(output: str) -> None:
    summary = output.splitlines()[-1]
    assert re.search(r"\d+ passed", summary), summary
    assert "failed" not in summary, summary
    assert "skipped" not in summary, summary
    assert f"serving-core check handlers/{NAME}" in output
    assert f"mypy handlers/{NAME}" in output
    # The image of handlers/sentiment was built and served its sample through nginx,
    # and the chart rendered with the values.
    passed = [line for line in output.splitlines() if line.startswith("PASSED")]
    assert any("test_stack.py" in line and "sample" in line for line in passed), output[-20000:]
    assert any("test_chart_user_values.py" in line for line in passed), output[-20000:]


def inner_env() -> dict[str, str]:
    # Not the outer make's flags or the outer venv: the clone's make check decides.
    dropped = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV", "PYTEST_ADDOPTS"}
    env = {k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("SERVING_")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))
    )
    # -rA: the summary names every test that passed, which the asserts below read.
    env |= {INSIDE: "1", "PYTEST_ADDOPTS": "-rA -p no:cacheprovider"}
    # The owner's identity, for the commit make upgrade makes.
    who = {"NAME": "New Owner", "EMAIL": "owner@example.com"}
    env |= {f"GIT_{role}_{k}": v for role in ("AUTHOR", "COMMITTER") for k, v in who.items()}
    return env


def test_a_fresh_clone_made_the_owners_passes_make_check_before_and_after_make_upgrade(
    tmp_path: Path,
) -> None:
    if os.environ.get(INSIDE):
        pytest.skip("this is the fresh clone's own run")
    upstream = upstream_of_two_versions(tmp_path / "upstream")
    repo = made_from_older(tmp_path / "repo")

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

    # 5. the README's own lines: image.yml's HANDLER_DIR, every example removed, make check
    step5 = block_with(f"HANDLER_DIR: handlers/{NAME}")
    lines = commands(step5.text)
    assert lines[-1].split("#")[0].strip() == "make check", lines
    env = inner_env()
    for line in lines[:-1]:
        run_as_written(repo, line, env, tmp_path / "step5.log")
    assert f"HANDLER_DIR: handlers/{NAME}" in (repo / IMAGE_YML).read_text()
    git(repo, "commit", "-q", "-m", f"serve handlers/{NAME} alone")
    assert sorted(p.name for p in (repo / "handlers").iterdir()) == [NAME]
    assert git(repo, "status", "--porcelain") == "", "the model file is committed with the rest"
    mine = owners_files(repo)

    # make check, the owner's suite, as the README's step 5 and CI run it.
    first = run_as_written(repo, lines[-1], env, tmp_path / "make-check.log")
    assert_the_check_passed((tmp_path / "make-check.log").read_text())

    # make upgrade, as the README says it; UPSTREAM names this upstream, as for a mirror.
    [upgrade] = commands(block_with("make upgrade    # from").text)
    upgraded = run_as_written(repo, upgrade, env | {"UPSTREAM": str(upstream)}, tmp_path / "up.log")
    said = (tmp_path / "up.log").read_text()
    assert f"v{OLDER} -> v{version()}, committed" in said, said
    assert git(repo, "diff", "--name-only", "--diff-filter=U") == ""
    assert git(repo, "status", "--porcelain") == "", said
    # The owner's files: as they were.
    assert owners_files(repo) == mine
    assert sorted(p.name for p in (repo / "handlers").iterdir()) == [NAME]
    image_yml = (repo / IMAGE_YML).read_text()
    assert f"\n  HANDLER_DIR: handlers/{NAME}\n" in image_yml
    # The framework's: upstream's N+1 everywhere else, image.yml's other lines included.
    upstream_yml = git(upstream, "show", f"v{version()}:{IMAGE_YML}")
    assert image_yml == re.sub(
        r"(?m)^  HANDLER_DIR: .*$", f"  HANDLER_DIR: handlers/{NAME}", upstream_yml
    )
    git(repo, "fetch", "-q", str(upstream), f"refs/tags/v{version()}:refs/upstream/next")
    rest = git(
        repo,
        "diff",
        "--stat",
        "refs/upstream/next",
        "HEAD",
        "--",
        ".",
        ":(exclude)handlers",
        f":(exclude){IMAGE_YML}",
    )
    assert rest == "", rest

    # make check again, on the upgraded repository.
    second = run_as_written(repo, lines[-1], env, tmp_path / "make-check-2.log")
    assert_the_check_passed((tmp_path / "make-check-2.log").read_text())

    TIMES.parent.mkdir(exist_ok=True)
    times = {
        "make_check_s": round(first),
        "make_upgrade_s": round(upgraded),
        "make_check_after_s": round(second),
    }
    TIMES.write_text(json.dumps(times) + "\n")
    print(f"template times: {times}")
