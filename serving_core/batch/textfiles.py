"""What JSONL and CSV records share (``jsonlfiles``, ``csvfiles``): line-based text, read as a
stream, appended to in chunks.

Output is append-only. Each chunk is one ``write`` and a flush, so a kill
(SIGKILL, Ctrl-C, a pod deleted) leaves whole rows and at most one torn last
row; ``written()`` truncates the file after the last whole row before a rerun
appends, and the records from there on are simply predicted again. (The page
cache survives a killed process, so a flush per chunk is enough; ``close``
fsyncs for a machine that loses power after a finished run.)

Only the last row can be torn: a kill stops the one writer mid-append, and
nothing follows it. So ``written()`` cuts off a bad last row, and refuses
anything else it cannot read (a bad row earlier, rows of another
``--id-field``, a file that is no batch output) with a ``RecordsError`` naming
``file:line``, before it changes a byte: a rerun never deletes rows, except the
error rows ``--retry-failed`` removes (``drop_failed``: the file rewritten whole).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from pathlib import Path
from typing import IO, Any

from serving_core import encoding
from serving_core.batch.durable import rewrite_without, temporary_glob
from serving_core.batch.records import RecordsError, Row

log = logging.getLogger("serving_core.batch.textfiles")


def open_input(path: str, mode: str, **options: Any) -> IO[Any]:
    try:
        return open(path, mode, **options)  # closed by the source's close()
    except OSError as exc:
        raise RecordsError(f"--input {path} cannot be read: {exc.strerror}") from exc


def count_lines(path: str) -> int:
    lines, last = 0, b"\n"
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def id_json(row: Row) -> bytes:
    try:
        return encoding.dumps(row.id)
    except TypeError:  # an id JSON cannot hold (a Decimal from SQL): its text
        return encoding.dumps(row.key)


class AppendSink:
    """An append-only file whose torn tail is cut off before a rerun appends."""

    def __init__(self, path: str) -> None:
        self.where = path
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "ab")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise RecordsError(f"--output {path} cannot be written: {exc.strerror}") from exc
        self._ready = False
        self._failed: list[tuple[str, int, int]] = []  # an error row's key, start, end

    def written(self) -> dict[str, bool]:
        keys: dict[str, bool] = {}
        self._failed = []
        path = Path(self.where)
        for stale in path.parent.glob(temporary_glob(path)):
            stale.unlink()  # a --retry-failed rewrite that a kill caught
        with open(self.where, "rb") as file:
            end = self._scan(file, keys)
        size = os.path.getsize(self.where)
        if end < size:
            # Only a kill mid-chunk leaves this; the rows from here on are predicted again.
            log.warning(
                "%s: dropping %d bytes after the last whole row (a run was killed mid-write)",
                self.where,
                size - end,
            )
            self._file.truncate(end)
        self._ready = True
        return keys

    def _scan(self, file: IO[bytes], keys: dict[str, bool]) -> int:
        """Read the rows into ``keys`` (through ``_row``); return the offset after the
        last whole one."""
        raise NotImplementedError

    def _row(self, keys: dict[str, bool], key: str, ok: bool, start: int, end: int) -> None:
        keys[key] = ok
        if not ok:
            self._failed.append((key, start, end))

    def drop_failed(self, keys: Collection[str]) -> None:
        if not self._ready:
            raise RuntimeError("call written() before drop_failed(): it finds the rows")
        spans = [(start, end) for key, start, end in self._failed if key in keys]
        if not spans:
            return
        self._file.close()
        rewrite_without(Path(self.where), spans)
        self._file = open(self.where, "ab")  # noqa: SIM115 - the new file; closed by close()
        self._failed = [failed for failed in self._failed if failed[0] not in keys]

    def _append(self, data: bytes) -> None:
        if not self._ready:
            raise RuntimeError("call written() before write(): it repairs a torn tail")
        self._file.write(data)
        self._file.flush()

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
