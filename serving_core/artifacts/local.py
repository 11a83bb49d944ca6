"""A local SERVING_MODEL_URI (an absolute path or ``file:///``): used in place, never
copied, as weights baked into the image are; its revision from a cheap walk."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from serving_core.artifacts.failures import FetchError
from serving_core.artifacts.stores import LOCAL_SCHEMES, STORES


def local_folder(uri: str) -> Path:
    """The folder ``uri`` names, which must exist."""
    parts = urlsplit(uri)
    if parts.scheme not in LOCAL_SCHEMES:
        schemes = ", ".join(f"{scheme}://" for scheme in sorted(STORES))
        raise FetchError(
            uri, f"no store reads {parts.scheme}://: use {schemes}, file:// or an absolute path"
        )
    path = Path(unquote(parts.path) if parts.scheme == "file" else uri)
    if not path.is_absolute():
        raise FetchError(uri, "a local path must be absolute (/models/name, file:///models/name)")
    if not path.exists():
        raise FetchError(uri, "missing: no such folder; check the path, or the volume it is on")
    if not path.is_dir():
        raise FetchError(uri, "a local model is a folder, not a file: name the folder holding it")
    return path


def walk_revision(folder: Path) -> tuple[str, int]:
    """(a digest of each file's relative path, size and mtime, the number of files)."""
    rows = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(root, name)
            try:
                stat = path.stat()
            except FileNotFoundError:  # a dangling link, or a file removed meanwhile
                continue
            rows.append([str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns])
    digest = hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]
    return f"sha256:{digest}", len(rows)
