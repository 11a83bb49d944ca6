"""Whole-file changes to a batch output that a kill or a power cut cannot tear.

A file is written under a temporary name beside it, fsynced, renamed over the
original and the directory fsynced: a reader, and a rerun, sees the old file
or the new one, never a mix. The temporary is created new (``O_EXCL``, a
random name, never through a symlink): the directory may be shared, and a
name planted there must not send the bytes anywhere else. The new file keeps
the mode of the one it replaces (an output made 0600 stays 0600).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

COPY_BLOCK_BYTES = 1 << 20
NEW_FILE_MODE = 0o666  # less the umask, as open() makes a file
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def temporary_glob(path: Path) -> str:
    """The names ``replacing(path)`` writes under, for removing what a kill left."""
    return f".{path.name}.*.tmp"


@contextlib.contextmanager
def replacing(path: Path, mode: int | None = None) -> Iterator[IO[bytes]]:
    """A new file to write, which takes ``path``'s place (whole, durably) when the
    block ends without an exception; ``mode``: its permission bits, else the umask's.
    """
    descriptor, temporary = _create_beside(path)
    try:
        with os.fdopen(descriptor, "wb") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    fsync_directory(path.parent)


def rewrite_without(path: Path, spans: Sequence[tuple[int, int]]) -> None:
    """Replace ``path`` by a copy without the byte ranges ``[start, end)`` in ``spans``
    (sorted, not overlapping), streamed: an output may be larger than memory."""
    with open(path, "rb") as source:
        status = os.fstat(source.fileno())
        with replacing(path, status.st_mode & 0o7777) as copy:
            at = 0
            for start, end in [*spans, (status.st_size, 0)]:
                source.seek(at)
                left = start - at
                while left > 0:
                    block = source.read(min(left, COPY_BLOCK_BYTES))
                    if not block:
                        break
                    copy.write(block)
                    left -= len(block)
                at = end


def _create_beside(path: Path) -> tuple[int, Path]:
    for _ in range(100):
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(temporary, _CREATE, NEW_FILE_MODE), temporary
        except FileExistsError:
            continue  # taken (or planted): another name
    raise FileExistsError(f"no free temporary name beside {path}")
