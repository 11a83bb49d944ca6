"""A scratch copy of the app's build context, for builds of a handler of a test's own.

What .dockerignore lets in (its allow-list), copied from the repository, with
handlers/ holding only the test's handler: the test controls every file the
build sees, and the layers it shares with the other builds stay cache hits.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from tests.servers import ROOT


def allowed() -> list[str]:
    """The top-level names .dockerignore's allow-list lets into the context."""
    return [
        line[1:].strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]


def app_context(tmp: Path, files: Mapping[str, str | bytes]) -> Path:
    """``tmp``/context: the repository's context files, handlers/ and models/ left
    out, and ``files`` (paths relative to the context) written into it."""
    context = tmp / "context"
    context.mkdir()
    shutil.copy2(ROOT / "Dockerfile", context)
    shutil.copy2(ROOT / ".dockerignore", context)
    for name in allowed():
        source = ROOT / name
        if name in {"handlers", "models"}:
            continue
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, context / name)
    for relative, content in files.items():
        path = context / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return context
