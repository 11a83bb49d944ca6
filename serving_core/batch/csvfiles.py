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
    """Every value arrives as text (CSV has no types); an empty cell is an empty string,
    a missing one None. A quote never closed runs to the end of the file (a torn
    file, or a stray ``"``): that row is a failed record naming its lines, never
    predicted mangled."""

    def __init__(self, path: str, id_field: str) -> None:
        self._path = path
        self._id_field = id_field
        self._file = open_input(path, "r", newline="", encoding="utf-8")
        self._lines = _Lines(self._file)
        self._reader = csv.reader(self._lines)
        header = next(self._reader, None)  # None: an empty file
        self._header = header or []
        if header is not None and self._lines.ended_in_a_row:
            self._file.close()
            raise RecordsError(
                f"--input {path}: the header (line 1) opens a quote that is never closed, "
                "so the whole file was read as the header: close the quote (a quote "
                'inside a field is written "")'
            )

    def count(self) -> int | None:
        return max(0, count_lines(self._path) - 1)  # less the header

    def __iter__(self) -> Iterator[Record]:
        header, reader, lines = self._header, self._reader, self._lines
        position = 0
        while True:
            first = reader.line_num + 1
            row = next(reader, None)
            if row is None:
                return
            if not row:
                continue  # a blank line is no record, as csv.DictReader has it
            if lines.ended_in_a_row:
                yield bad_record(
                    position,
                    f"line {first}: the row starting here has a quoted field that is never "
                    f"closed, so lines {first}-{reader.line_num} (the rest of the file) were "
                    "read as this one row: the file is torn, or holds a stray quote (a quote "
                    'inside a field is written ""); fix it and rerun with --retry-failed',
                    self._id_in(row[:-1]),  # not the last field: the quote ran on in it
                )
            elif len(row) > len(header):
                yield bad_record(
                    position,
                    f"line {reader.line_num} has more fields than the header",
                    self._id_in(row),
                )
            else:
                fields: dict[str, str | None] = dict.fromkeys(header)
                fields.update(zip(header, row, strict=False))
                yield make_record(fields, position, self._id_field)
            position += 1

    def _id_in(self, row: list[str]) -> str | None:
        """The id of a row that cannot be a record, where it was read."""
        return dict(zip(self._header, row, strict=False)).get(self._id_field) or None

    def close(self) -> None:
        self._file.close()


class _Lines:
    """A text file's lines for ``csv.reader``, knowing whether the reader asked past
    the end: it does so only inside a quoted field, since a row ends with its line."""

    def __init__(self, file: IO[str]) -> None:
        self._file = file
        self.ended_in_a_row = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        line = self._file.readline()
        if not line:
            self.ended_in_a_row = True
            raise StopIteration
        return line


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
