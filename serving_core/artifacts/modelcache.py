"""SERVING_MODEL_CACHE's layout for one URI, and its lock.

    CACHE/<slug>-<12 hex>/         one folder per URI (its masked form, hashed)
        .lock                      flock'ed by a fetch: pods sharing a volume fetch once
        current                    the revision last fetched (what offline serves)
        <16 hex>/                  a revision: complete and verified, renamed into place
        .staging/<16 hex>/files/   a revision being fetched: its files, written in place
        .staging/<16 hex>/parts/   the parts already on disk, a journal a file

A revision folder appears whole by one rename, so a half-written one is never
served; the staging folders of other revisions (an object that changed) are
removed when a fetch starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from serving_core.settings.secrets import masked

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ModelCache:
    def __init__(self, cache: Path, uri: str) -> None:
        shown = masked(uri)
        slug = _UNSAFE.sub("-", shown.split("://", 1)[-1]).strip("-.")[:60]
        self.root = cache / f"{slug}-{hashlib.sha256(shown.encode()).hexdigest()[:12]}"

    @contextlib.contextmanager
    def locked(self, *, shared: bool = False) -> Iterator[None]:
        """Hold the URI's lock: a fetch alone (exclusive), an offline read beside other
        reads (``shared``), each waiting for a fetch under way."""
        self.root.mkdir(parents=True, exist_ok=True)
        # A reader opens it read-only: an offline pod may mount the volume so.
        fd = os.open(
            self.root / ".lock", (os.O_RDONLY if shared else os.O_RDWR) | os.O_CREAT, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def current(self) -> str | None:
        """The revision last fetched, if its folder is here."""
        try:
            revision = (self.root / "current").read_text().strip()
        except FileNotFoundError:
            return None
        return revision if self.folder(revision).is_dir() else None

    def folder(self, revision: str) -> Path:
        return self.root / _hex(revision)

    def staging(self, revision: str) -> tuple[Path, Path]:
        """(files, journals) of ``revision``'s staging; other revisions' are removed."""
        staging = self.root / ".staging"
        if staging.is_dir():
            for other in staging.iterdir():
                if other.name != _hex(revision):
                    shutil.rmtree(other, ignore_errors=True)
        files, journals = staging / _hex(revision) / "files", staging / _hex(revision) / "parts"
        files.mkdir(parents=True, exist_ok=True)
        journals.mkdir(parents=True, exist_ok=True)
        return files, journals

    def publish(self, revision: str) -> Path:
        """Rename the staged files into place, then point ``current`` at them."""
        target = self.folder(revision)
        staged = self.root / ".staging" / _hex(revision)
        os.rename(staged / "files", target)
        shutil.rmtree(staged, ignore_errors=True)
        self.point(revision)
        return target

    def point(self, revision: str) -> None:
        temporary = self.root / f".current.{os.getpid()}"
        temporary.write_text(revision + "\n")
        os.replace(temporary, self.root / "current")


def _hex(revision: str) -> str:
    return revision.partition(":")[2] or revision
