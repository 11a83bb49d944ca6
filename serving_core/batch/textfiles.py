"""JSONL and CSV records: line-based text, read as a stream, appended to in chunks.

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

Output rows: JSONL ``{ID_FIELD: id, "output": {...}}`` or
``{ID_FIELD: id, "error": {"type", "message"}}``; CSV the columns
``ID_FIELD,output,error`` with the output or the error as JSON text and the
other empty.
"""

from __future__ import annotations

import csv
import io
import logging
import os
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from serving_core import encoding
from serving_core.batch.durable import rewrite_without
from serving_core.batch.records import Record, RecordsError, Row, bad_record, make_record

log = logging.getLogger("serving_core.batch.textfiles")
CSV_COLUMNS = ("output", "error")


def _open_input(path: str, mode: str, **options: Any) -> IO[Any]:
    try:
        return open(path, mode, **options)  # closed by the source's close()
    except OSError as exc:
        raise RecordsError(f"--input {path} cannot be read: {exc.strerror}") from exc


def _count_lines(path: str) -> int:
    lines, last = 0, b"\n"
    with open(path, "rb") as file:
        while block := file.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


class JsonlSource:
    def __init__(self, path: str, id_field: str) -> None:
        self._path = path
        self._id_field = id_field
        self._file = _open_input(path, "rb")

    def count(self) -> int | None:
        return _count_lines(self._path)

    def __iter__(self) -> Iterator[Record]:
        position = 0
        for number, line in enumerate(self._file, 1):
            if not line.strip():
                continue  # blank lines are not records and take no position
            try:
                value = encoding.loads(line)
            except encoding.JSONDecodeError as exc:
                yield bad_record(position, f"line {number} is not JSON: {exc}")
            else:
                if isinstance(value, dict):
                    yield make_record(value, position, self._id_field)
                else:
                    kind = type(value).__name__
                    yield bad_record(position, f"line {number} is a JSON {kind}, not an object")
            position += 1

    def close(self) -> None:
        self._file.close()


class CsvSource:
    """Every value arrives as text (CSV has no types); an empty cell is an empty string."""

    def __init__(self, path: str, id_field: str) -> None:
        self._path = path
        self._id_field = id_field
        self._file = _open_input(path, "r", newline="", encoding="utf-8")

    def count(self) -> int | None:
        return max(0, _count_lines(self._path) - 1)  # less the header

    def __iter__(self) -> Iterator[Record]:
        reader = csv.DictReader(self._file)
        for position, fields in enumerate(reader):
            if None in fields:
                yield bad_record(
                    position, f"line {reader.line_num} has more fields than the header"
                )
            else:
                yield make_record(fields, position, self._id_field)

    def close(self) -> None:
        self._file.close()


def _id_json(row: Row) -> bytes:
    try:
        return encoding.dumps(row.id)
    except TypeError:  # an id JSON cannot hold (a Decimal from SQL): its text
        return encoding.dumps(row.key)


class _AppendSink:
    """An append-only file whose torn tail is cut off before a rerun appends."""

    def __init__(self, path: str) -> None:
        self.where = path
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 - closed by close()
        self._ready = False
        self._failed: list[tuple[str, int, int]] = []  # an error row's key, start, end

    def written(self) -> dict[str, bool]:
        keys: dict[str, bool] = {}
        self._failed = []
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


class JsonlSink(_AppendSink):
    def __init__(self, path: str, id_field: str) -> None:
        super().__init__(path)
        self._id_field = id_field
        self._id_prefix = b"{" + encoding.dumps(id_field) + b":"

    def _scan(self, file: IO[bytes], keys: dict[str, bool]) -> int:
        end = 0
        for number, line in enumerate(iter(file.readline, b""), 1):
            try:
                row = encoding.loads(line) if line.endswith(b"\n") else None
            except encoding.JSONDecodeError:
                row = None
            if row is None:
                if file.read(1):  # rows follow it: no kill left this
                    raise self._refused(number, "is not a whole JSON row")
                break  # the torn last row of a killed run
            key = self._key(row, number)
            text = key if isinstance(key, str) else encoding.dumps(key).decode()
            self._row(keys, text, "error" not in row, end, end + len(line))
            end += len(line)
        return end

    def _key(self, row: Any, number: int) -> Any:
        if not isinstance(row, dict):
            raise self._refused(number, f"is a JSON {type(row).__name__}, not a row")
        if "output" not in row and "error" not in row:
            raise self._refused(number, "has no output and no error: not a batch output row")
        if self._id_field not in row:
            first = next(iter(row))  # the id comes first in every row written
            raise RecordsError(
                f"{self.where}:{number}: the rows' id field is {first!r}, not "
                f"{self._id_field!r}: rerun with --id-field {first} (or choose another "
                "--output); nothing was written"
            )
        return row[self._id_field]

    def _refused(self, number: int, what: str) -> RecordsError:
        return RecordsError(
            f"{self.where}:{number}: line {number} {what}, and only the last row can be "
            "torn (by a kill); the file was changed by something else. Fix or delete that "
            "line, or choose another --output; nothing was written"
        )

    def write(self, rows: Sequence[Row]) -> None:
        parts = []
        for row in rows:
            if row.output is not None:
                body = b',"output":' + row.output
            else:
                body = b',"error":' + (row.error or b"null")
            parts.append(self._id_prefix + _id_json(row) + body + b"}\n")
        self._append(b"".join(parts))


class CsvSink(_AppendSink):
    def __init__(self, path: str, id_field: str) -> None:
        super().__init__(path)
        self._header = [id_field, *CSV_COLUMNS]

    def _scan(self, file: IO[bytes], keys: dict[str, bool]) -> int:
        size = os.fstat(file.fileno()).st_size
        lines = _TrackedLines(file)
        # csv.reader pulls exactly the lines of one row (a quoted field may span
        # several), so the offset after each row is where that row ends.
        reader = csv.reader(lines)
        end = 0
        try:
            header = next(reader, None)
            if header is None:
                return 0
            if not lines.whole:
                file.seek(0)
                if self._csv([self._header]).startswith(file.read()):
                    return 0  # the header a kill tore: start the file again
            if header != self._header:
                raise RecordsError(
                    f"--output {self.where} has the columns {','.join(header)}, not "
                    f"{','.join(self._header)}; choose another output (or the same --id-field)"
                )
            end = lines.offset
            for row in reader:
                if len(row) != len(self._header) or not lines.whole:
                    break
                self._row(keys, row[0], row[2] == "", end, lines.offset)
                end = lines.offset
        except csv.Error:
            pass  # a quoted field cut by a kill: everything from the last whole row goes
        if lines.offset < size:  # rows follow the bad one: no kill left this
            raise RecordsError(
                f"{self.where}:{reader.line_num}: the row ending on line {reader.line_num} "
                "is not a whole row of the columns "
                f"{','.join(self._header)}, and only the last row can be torn (by a kill); "
                "fix or delete it, or choose another --output; nothing was written"
            )
        return end

    def written(self) -> dict[str, bool]:
        keys = super().written()
        if os.path.getsize(self.where) == 0:
            self._append(self._csv([self._header]))
        return keys

    def write(self, rows: Sequence[Row]) -> None:
        self._append(
            self._csv(
                [
                    row.key,
                    "" if row.output is None else row.output.decode(),
                    "" if row.error is None else row.error.decode(),
                ]
                for row in rows
            )
        )

    @staticmethod
    def _csv(rows: Iterable[Sequence[str]]) -> bytes:
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        return text.getvalue().encode()


class _TrackedLines:
    """A binary file's lines as text, knowing the offset after the last line read."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.offset = 0
        self.whole = True  # the last line read ends with its newline

    def __iter__(self) -> Iterator[str]:
        for raw in self._file:
            self.offset += len(raw)
            self.whole = raw.endswith(b"\n")
            yield raw.decode("utf-8", errors="replace")
