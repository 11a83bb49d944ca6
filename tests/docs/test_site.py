"""The docs site (mkdocs.yml over docs/): it builds with --strict, and each way a page can
break fails that build, shown on a scratch copy of the repository's files. `make docs`
(which `make test` runs) builds the real one; docs/repo_links.py checks the links that
leave docs/, and the README's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.readme import README
from tests.servers import ROOT, git_ls_files

MKDOCS = Path(sys.executable).parent / "mkdocs"
FRONT_PAGE_LINES = 200  # issue 24: the README is a front page; the manual is docs/


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=root,
        env={"PATH": str(MKDOCS.parent), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the files git would commit (tracked and untracked-not-ignored), so that
    the links to the chart, the benchmarks and the dashboard find what they name; it
    builds as it is."""
    into = tmp_path_factory.mktemp("pristine")
    for name in git_ls_files("--cached", "--others", "--exclude-standard"):
        source = ROOT / name
        if source.is_file() or source.is_symlink():  # a link stays a link
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name, follow_symlinks=False)
    built = build(into, into.parent / "pristine-site")
    assert built.returncode == 0, built.stdout + built.stderr
    return into


def test_the_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < FRONT_PAGE_LINES, (
        f"README.md has {lines} lines: keep it a front page (the pitch, the two commands, "
        "the five steps, the features, the layout) and move the rest into a page of docs/"
    )


def test_the_docs_build_with_strict(tmp_path: Path) -> None:
    built = build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()


def append(path: str, text: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        with (root / path).open("a", encoding="utf-8") as page:
            page.write(text)

    return change


def unlisted_page(root: Path) -> None:
    (root / "docs" / "forgotten.md").write_text("# A page in no nav\n")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (append("docs/cache.md", "\n[gone](no-such-page.md)\n"), "no-such-page.md"),
        (append("docs/cache.md", "\n[gone](jobs.md#no-such-heading)\n"), "no-such-heading"),
        (append("docs/cache.md", "\n[gone](../bench/NO-SUCH.md)\n"), "does not exist"),
        (
            append("docs/cache.md", "\n[gone](../bench/README.md#no-such-heading)\n"),
            "has no heading with that id",
        ),
        (append("README.md", "\n[gone](docs/no-such-page.md)\n"), "does not exist"),
        (append("README.md", "\n[gone](docs/jobs.md#no-such-heading)\n"), "no heading"),
        (unlisted_page, "forgotten.md"),
    ],
    ids=[
        "a page that is not there",
        "an anchor that is not there",
        "a repository file that is not there",
        "a heading of a repository file that is not there",
        "a README link to a page that is not there",
        "a README link to an anchor that is not there",
        "a page left out of the nav",
    ],
)
def test_a_broken_page_fails_the_build(
    pristine: Path, tmp_path: Path, change: Callable[[Path], None], says: str
) -> None:
    root = shutil.copytree(pristine, tmp_path / "repo", symlinks=True)
    change(root)
    built = build(root, tmp_path / "site")
    assert built.returncode != 0, built.stdout + built.stderr
    assert says in built.stdout + built.stderr
