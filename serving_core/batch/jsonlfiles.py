"""JSONL records: one JSON object a line in; ``{ID_FIELD: id, "output": {...}}`` or
``{ID_FIELD: id, "error": {"type", "message"}}`` a line out, appended (``textfiles``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import IO, Any

from serving_core import encoding
from serving_core.batch.records import (
    Location,
    Record,
    RecordsError,
    RecordSink,
    RecordSource,
    Row,
    Shard,
    bad_record,
    make_record,
    sharded_path,
)
from serving_core.batch.textfiles import AppendSink, count_lines, id_json, open_input

DATABASE = False


def open_source(location: Location, id_field: str) -> RecordSource:
    return JsonlSource(location.target, id_field)


def open_sink(location: Location, id_field: str, shard: Shard) -> RecordSink:
    return JsonlSink(sharded_path(location.target, shard), id_field)


class JsonlSource:
    def __init__(self, path: str, id_field: str) -> None:
        self._path = path
        self._id_field = id_field
        self._file = open_input(path, "rb")

    def count(self) -> int | None:
        return count_lines(self._path)

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


class JsonlSink(AppendSink):
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
            parts.append(self._id_prefix + id_json(row) + body + b"}\n")
        self._append(b"".join(parts))
