"""The files ``serving-core serve --reload`` watches: the handler's folder, polled.

The folder is the one SERVING_HANDLER (or ``serve``'s argument) names: a
``handler.py``'s or a ``pipeline.yaml``'s folder, the folder itself, or a
module path's file's folder, found on ``sys.path`` without importing it (the
reloader runs no handler code). Its source files are watched, in every folder
below it but hidden ones and ``__pycache__``: ``WATCHED_SUFFIXES``. Only
those: a handler that writes a cache beside itself (an exported graph, a
downloaded model) must not set off a reload each time it starts.

Polled, not notified: a stat of a handler's few files every few hundred
milliseconds costs nothing, needs no dependency, and sees every way an editor
saves (in place, or a new file renamed over the old one).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from serving_core.settings import SettingsError

WATCHED_SUFFIXES = (".py", ".json", ".yaml", ".yml", ".toml")
SKIPPED_FOLDERS = ("__pycache__", "node_modules")

# What a file looked like: its path, inode (a save by rename makes a new one),
# size and modification time.
Snapshot = frozenset[tuple[str, int, int, int]]


def handler_folder(spec: str, search_path: Sequence[str] = ()) -> Path:
    """The folder of the handler ``spec`` names (SERVING_HANDLER's forms); a module path
    is looked up on ``search_path`` (default ``sys.path``). Raises ``SettingsError``
    when it names nothing on disk."""
    target = spec.partition(":")[0]
    path = Path(target)
    if path.is_dir():
        return path.resolve()
    if path.is_file():
        return path.resolve().parent
    parts = target.split(".")
    for entry in search_path or sys.path:
        base = Path(entry or os.curdir).joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve().parent
    raise SettingsError(
        f"--reload: the handler {spec!r} is not a file, a folder, or a module found on "
        "sys.path; give serve the handler's folder (serving-core serve --reload handlers/NAME)"
    )


class HandlerFiles:
    """The source files under ``folders``, as a ``Snapshot`` to compare with the last."""

    def __init__(self, folders: Sequence[Path]) -> None:
        self.folders = tuple(folders)

    def snapshot(self) -> Snapshot:
        seen: set[tuple[str, int, int, int]] = set()
        for folder in self.folders:
            for root, dirs, files in os.walk(folder):
                # Pruned in place: os.walk then does not enter them.
                dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIPPED_FOLDERS]
                for name in files:
                    if not name.endswith(WATCHED_SUFFIXES) or name.startswith("."):
                        continue
                    path = os.path.join(root, name)
                    try:
                        stat = os.stat(path)
                    except OSError:
                        continue  # removed between the listing and the stat
                    seen.add((path, stat.st_ino, stat.st_size, stat.st_mtime_ns))
        return frozenset(seen)

    def describe(self) -> str:
        return ", ".join(str(folder) for folder in self.folders)


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """The paths that were added, removed or modified, sorted."""
    return sorted({entry[0] for entry in before ^ after})
