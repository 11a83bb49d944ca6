"""Whole-file changes to a batch output that a kill or a power cut cannot tear.

A file is rewritten under a hidden temporary name, fsynced, renamed over the
original and the directory fsynced: a reader, and a rerun, sees the old file
or the new one, never a mix.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

COPY_BLOCK_BYTES = 1 << 20


def fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def rewrite_without(path: Path, spans: Sequence[tuple[int, int]]) -> None:
    """Replace ``path`` by a copy without the byte ranges ``[start, end)`` in ``spans``
    (sorted, not overlapping), streamed: an output may be larger than memory."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(path, "rb") as source, open(temporary, "wb") as copy:
        at = 0
        for start, end in [*spans, (os.fstat(source.fileno()).st_size, 0)]:
            source.seek(at)
            left = start - at
            while left > 0:
                block = source.read(min(left, COPY_BLOCK_BYTES))
                if not block:
                    break
                copy.write(block)
                left -= len(block)
            at = end
        copy.flush()
        os.fsync(copy.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)
