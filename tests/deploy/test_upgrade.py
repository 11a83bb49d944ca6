"""`make upgrade` (tools/upgrade, docs/upgrading.md) on a small upstream of two
versions: a repository made from v0.1.0, then made its owner's, takes v0.2.0 as
one commit; what the owner has (their handler, image.yml's HANDLER_DIR, their
values, the examples they deleted, their own edit of a framework file) stays, and
every change upstream made to the framework arrives. The whole template, its own
check before and after, is tests/deploy/test_template.py's."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.workflows import run, tool
from tests.servers import ROOT

IMAGE_YML = ".github/workflows/image.yml"
V1 = {
    "pyproject.toml": '[project]\nname = "serving-core"\nversion = "0.1.0"\n',
    IMAGE_YML: "env:\n  # the one handler the image serves\n  HANDLER_DIR: handlers/minilm\n"
    "  IMAGE: app\njobs: {}\n",
    "serving_core/door.py": "def answer():\n    return 1\n\n\ndef refuse():\n    return 2\n",
    "serving_core/old.py": "gone = True\n",
    "handlers/echo/handler.py": "class Echo:\n    pass\n",
    "handlers/minilm/handler.py": "class MiniLM:\n    pass\n",
    "docs/jobs.md": "# Jobs\n",
}
V2 = {
    **V1,
    "pyproject.toml": V1["pyproject.toml"].replace("0.1.0", "0.2.0"),
    # Upstream's change right beside the owner's HANDLER_DIR line.
    IMAGE_YML: V1[IMAGE_YML].replace("  IMAGE: app", "  IMAGE: app-v2"),
    "serving_core/door.py": V1["serving_core/door.py"].replace("return 1", "return 10"),
    "serving_core/new.py": "new = True\n",
    "handlers/echo/handler.py": "class Echo:\n    version = 2\n",
    "handlers/minilm/handler.py": "class MiniLM:\n    version = 2\n",
    "docs/jobs.md": "# Jobs, v2\n",
}
del V2["serving_core/old.py"]
SENTIMENT = "class Sentiment:\n    pass\n"
VALUES = "replicaCount: 3\n"


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["git", *args], cwd=repo, env=git_env(), capture_output=True, text=True, check=False
    )
    assert not check or done.returncode == 0, f"git {args}: {done.stdout}{done.stderr}"
    return done


def git_env() -> dict[str, str]:
    who = {"NAME": "Owner", "EMAIL": "owner@example.com"}
    env = {f"GIT_{role}_{k}": v for role in ("AUTHOR", "COMMITTER") for k, v in who.items()}
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env}


def write(repo: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    for name in ("Makefile", "tools/upgrade"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, repo / name)


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    repo = tmp_path / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for version, files in (("v0.1.0", V1), ("v0.2.0", V2)):
        for old in set(V1) - set(files):
            (repo / old).unlink()
        write(repo, files)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", version)
        git(repo, "tag", version)
    return repo


def made_from_v1(upstream: Path, into: Path, how: str) -> Path:
    """A repository made from v0.1.0: a clone, or GitHub's "Use this template" (a
    new history), then made its owner's as the README says."""
    if how == "clone":
        git(upstream.parent, "clone", "-q", "--branch", "v0.1.0", str(upstream), str(into))
        git(into, "switch", "-q", "-c", "main")
    else:
        into.mkdir()
        git(into, "init", "-q", "-b", "main")
        write(into, V1)
        git(into, "add", "-A")
        git(into, "commit", "-q", "-m", "Initial commit")
    write_owner(into)
    return into


def write_owner(repo: Path) -> None:
    (repo / "handlers/sentiment").mkdir(parents=True)
    (repo / "handlers/sentiment/handler.py").write_text(SENTIMENT)
    (repo / "helm").mkdir(exist_ok=True)
    (repo / "helm/values.yaml").write_text(VALUES)
    image_yml = repo / IMAGE_YML
    image_yml.write_text(image_yml.read_text().replace("handlers/minilm", "handlers/sentiment"))
    # The owner's own edit of a framework file, away from upstream's.
    door = repo / "serving_core/door.py"
    door.write_text(door.read_text().replace("return 2", "return 20"))
    git(repo, "rm", "-r", "-q", "handlers/echo", "handlers/minilm", "docs/jobs.md")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "serve handlers/sentiment alone")


def make_upgrade(repo: Path, upstream: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # TORCH_INDEX_URL set: the Makefile probes no index for a target that installs nothing.
    env = git_env() | {"UPSTREAM": str(upstream), "TORCH_INDEX_URL": ""}
    return subprocess.run(
        ["make", "--no-print-directory", "upgrade", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize("how", ["template", "clone"])
def test_upgrade_brings_the_frameworks_changes_and_leaves_the_owners(
    tmp_path: Path, upstream: Path, how: str
) -> None:
    repo = made_from_v1(upstream, tmp_path / "mine", how)
    done = make_upgrade(repo, upstream)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "v0.1.0 -> v0.2.0, committed" in done.stderr
    assert git(repo, "status", "--porcelain").stdout == ""
    assert git(repo, "log", "-1", "--format=%s").stdout.strip() == (
        "serving-core v0.2.0 (make upgrade from v0.1.0)"
    )
    # The owner's: untouched.
    assert (repo / "handlers/sentiment/handler.py").read_text() == SENTIMENT
    assert (repo / "helm/values.yaml").read_text() == VALUES
    assert sorted(p.name for p in (repo / "handlers").iterdir()) == ["sentiment"]
    assert not (repo / "docs/jobs.md").exists()
    image_yml = (repo / IMAGE_YML).read_text()
    assert "  HANDLER_DIR: handlers/sentiment\n  IMAGE: app-v2\n" in image_yml
    # The framework's: upstream's changes, the owner's own edit kept beside them.
    assert (repo / "serving_core/door.py").read_text() == (
        "def answer():\n    return 10\n\n\ndef refuse():\n    return 20\n"
    )
    assert (repo / "serving_core/new.py").read_text() == V2["serving_core/new.py"]
    assert not (repo / "serving_core/old.py").exists()
    assert 'version = "0.2.0"' in (repo / "pyproject.toml").read_text()
    # And once there, there is nothing more to take.
    again = make_upgrade(repo, upstream)
    assert again.returncode == 0, again.stderr
    assert "already at v0.2.0" in again.stderr


def test_a_change_of_both_to_the_same_lines_is_a_conflict_left_to_resolve(
    tmp_path: Path, upstream: Path
) -> None:
    repo = made_from_v1(upstream, tmp_path / "mine", "template")
    door = repo / "serving_core/door.py"
    door.write_text(door.read_text().replace("return 1", "return 100"))
    git(repo, "commit", "-q", "-am", "my own answer")
    head = git(repo, "rev-parse", "HEAD").stdout

    done = make_upgrade(repo, upstream)
    assert done.returncode != 0
    assert "left conflicts" in done.stderr, done.stderr
    assert "git add" in done.stderr
    assert git(repo, "rev-parse", "HEAD").stdout == head, "nothing is committed"
    assert "<<<<<<<" in door.read_text()
    conflicted = git(repo, "diff", "--name-only", "--diff-filter=U").stdout.split()
    assert conflicted == ["serving_core/door.py"]
    # Still the owner's, conflict or not.
    assert (repo / "handlers/sentiment/handler.py").read_text() == SENTIMENT
    assert "  HANDLER_DIR: handlers/sentiment\n" in (repo / IMAGE_YML).read_text()


def test_upgrade_refuses_to_start_over_uncommitted_changes(tmp_path: Path, upstream: Path) -> None:
    repo = made_from_v1(upstream, tmp_path / "mine", "template")
    (repo / "handlers/sentiment/handler.py").write_text(SENTIMENT + "# wip\n")
    done = make_upgrade(repo, upstream)
    assert done.returncode != 0
    assert "commit or stash your changes first" in done.stderr
    assert 'version = "0.1.0"' in (repo / "pyproject.toml").read_text()


def test_the_script_passes_shellcheck() -> None:
    result = run(tool("shellcheck"), "--severity=style", str(ROOT / "tools" / "upgrade"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_to_on_the_command_line_names_the_version(tmp_path: Path, upstream: Path) -> None:
    repo = made_from_v1(upstream, tmp_path / "mine", "template")
    done = make_upgrade(repo, upstream, "TO=v0.1.0")
    assert done.returncode == 0, done.stderr
    assert "already at v0.1.0" in done.stderr
    missing = make_upgrade(repo, upstream, "TO=v9.9.9")
    assert missing.returncode != 0
    assert "could not fetch the tags v0.1.0 and v9.9.9" in missing.stderr
