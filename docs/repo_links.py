"""mkdocs hook: links to files of the repository outside docs/, and the README's links.

The pages are read on GitHub as much as on the built site, so they link to the
chart, the benchmarks or the dashboard by relative path
(``../helm/serving-core/README.md``), which GitHub resolves. mkdocs cannot (the
file is no page of the site) and, with ``--strict``, fails on it. So for each
such link this hook checks that the file is there (and, for a Markdown file,
the ``#anchor``, by GitHub's heading ids), and points the link at the file
under ``repo_url``. The README is no page either; its links to the pages and
files are checked here the same way, since PyPI and GitHub show it. A broken
one fails the build, naming the page and the link.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from mkdocs.exceptions import PluginError

BRANCH = "main"  # the branch the workflows build and publish from
LINK = re.compile(r"(\]\()([^)\s]+)(\))")  # [text](target), images too
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")


def on_pre_build(config: Any) -> None:
    root = _normal(Path(config.config_file_path).parent)
    readme = root / "README.md"
    for target in _links(readme.read_text(encoding="utf-8")):
        _check(readme, target, root)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = _normal(Path(config.config_file_path).parent)
    docs = _normal(Path(config.docs_dir))
    page_path = _normal(Path(page.file.abs_src_path))
    repo_url = (config.repo_url or "").rstrip("/")

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        path = _outside(page_path, target, docs)
        if path is None:
            return match.group(0)  # a page of the site, or not a file link: mkdocs checks it
        _check(page_path, target, root)
        if not repo_url:
            raise PluginError(
                f"{page.file.src_uri} links to {target}, outside docs/: set repo_url in "
                "mkdocs.yml, so the site can point the link at the repository"
            )
        kind = "tree" if path.is_dir() else "blob"
        anchor = urlsplit(target).fragment
        relative = path.relative_to(root).as_posix()
        url = f"{repo_url}/{kind}/{BRANCH}/{relative}" + (f"#{anchor}" if anchor else "")
        return f"{match.group(1)}{url}{match.group(3)}"

    return _outside_fences(markdown, lambda text: LINK.sub(rewrite, text))


def _links(markdown: str) -> list[str]:
    found: list[str] = []

    def keep(text: str) -> str:
        found.extend(m.group(2) for m in LINK.finditer(text))
        return text

    _outside_fences(markdown, keep)
    return found


def _outside_fences(markdown: str, change: Any) -> str:
    """``change`` applied to the text between fenced code blocks, which are kept as they are."""
    out: list[str] = []
    prose: list[str] = []
    fenced = False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line):
            if not fenced:
                out.append(change("".join(prose)))
                prose = []
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)
        else:
            prose.append(line)
    out.append(change("".join(prose)))
    return "".join(out)


def _is_file_link(target: str) -> bool:
    parts = urlsplit(target)
    return not (parts.scheme or parts.netloc or target.startswith(("#", "/", "mailto:")))


def _outside(page: Path, target: str, docs: Path) -> Path | None:
    """The file a relative link of ``page`` names, when it is outside ``docs``."""
    if not _is_file_link(target):
        return None
    path = _normal(page.parent / unquote(urlsplit(target).path))
    return None if path.is_relative_to(docs) else path


def _check(page: Path, target: str, root: Path) -> None:
    if not _is_file_link(target):
        return
    parts = urlsplit(target)
    path = _normal(page.parent / unquote(parts.path))
    where = f"{page.relative_to(root)} links to {target}"
    if not path.is_relative_to(root):
        raise PluginError(f"{where}, outside the repository: link to a file in it")
    if not path.exists():
        raise PluginError(f"{where}, which does not exist: fix the path or the file's name")
    if parts.fragment and path.suffix == ".md" and parts.fragment not in github_ids(path):
        raise PluginError(
            f"{where}, but {path.relative_to(root)} has no heading with that id: "
            "GitHub's id is the heading lower-cased, without punctuation, spaces as '-'"
        )


def _normal(path: Path) -> Path:
    """Absolute, with ``..`` folded, but links not followed: a link to a symbolic link
    (deploy/grafana/serving-core.json) names the link's path in the repository."""
    return Path(os.path.normpath(path.absolute()))


def github_ids(path: Path) -> set[str]:
    """The ids GitHub gives a Markdown file's headings (a repeated one gets -1, -2, ...)."""
    ids: set[str] = set()
    seen: dict[str, int] = {}

    def collect(text: str) -> str:
        for line in text.splitlines():
            if match := HEADING.match(line):
                slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
                count = seen.get(slug, 0)
                seen[slug] = count + 1
                ids.add(slug if count == 0 else f"{slug}-{count}")
        return text

    _outside_fences(path.read_text(encoding="utf-8"), collect)
    return ids
