"""CSV records: a header and rows in, every value as text; the columns
``ID_FIELD,output,error`` out, the output or the error as JSON text and the other
empty, appended (``textfiles``)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import IO

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
from serving_core.batch.textfiles import AppendSink, count_lines, open_input

DATABASE = False
CSV_COLUMNS = ("output", "error")


def open_source(location: Location, id_field: str) -> RecordSource:
    return CsvSource(location.target, id_field)


def open_sink(location: Location, id_field: str, shard: Shard) -> RecordSink:
    return CsvSink(sharded_path(location.target, shard), id_field)


class CsvSource:
    """Every value arrives as text (CSV has no types); an empty cell is an empty string."""

    def __init__(self, path: str, id_field: str) -> None:
        self._path = path
        self._id_field = id_field
        self._file = open_input(path, "r", newline="", encoding="utf-8")

    def count(self) -> int | None:
        return max(0, count_lines(self._path) - 1)  # less the header

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


class CsvSink(AppendSink):
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
