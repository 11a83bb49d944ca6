"""Records in and results out of ``serving-core batch``: ids, shards, and where they live.

A *location* is a path or a database URL (with a table or a query), and the
format ``formats`` chose for it by its suffix or scheme. Every format has a
``RecordSource`` (records in, with a count for the progress bar when one is cheap)
and a ``RecordSink`` (rows out, in chunks, each chunk durable before ``write``
returns, and ``written()`` for resuming). The formats are modules of their own
(``jsonlfiles``, ``csvfiles``, ``parquetfiles``, ``sqltables``), below
``formats``, whose table names them.

Ids: a record's id is its ``id_field`` value, or else its 0-based position in
the input. Resume and shards compare ids as text (``id_key``), so ``7`` and
``"7"`` are the same record.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from serving_core import encoding
from serving_core.handler import Params
from serving_core.settings.secrets import masked

DEFAULT_OUTPUT_TABLE = "results"


class RecordsError(Exception):
    """A location cannot be read or written; the message says which and how to fix it."""


@dataclass(frozen=True)
class Record:
    """One input record. ``params`` is the record without its id field (so an id never
    reaches the handler, its schema or a cache key); ``error`` marks a record that
    could not be read as parameters (a bad JSON line): it is written with that error."""

    id: Any
    key: str
    params: Params
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class Row:
    """One output row: the id, and the output or the error as JSON, never both."""

    id: Any
    key: str
    output: bytes | None = None
    error: bytes | None = None


def id_key(value: Any) -> str:
    """The id as text: what resume and shards compare."""
    return value if isinstance(value, str) else encoding.dumps(value).decode()


def make_record(fields: dict[str, Any], position: int, id_field: str) -> Record:
    params = dict(fields)
    value = params.pop(id_field, None)
    if value is None:
        value = position
    return Record(value, id_key(value), params)


def bad_record(position: int, message: str, value: Any = None) -> Record:
    """A record that could not be read, under its id ``value`` where that was read
    whole, else its position."""
    error = {"type": "bad_request", "message": message}
    value = position if value is None else value
    return Record(value, id_key(value), {}, error)


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``: owns the records whose id hashes to ``index``.

    By a stable hash of the id, not by position: every pod then agrees on who
    owns a record even when the input's order is not stable (a SQL query with
    no ORDER BY, a Parquet directory that gained a file), and the split does
    not move when a rerun skips what is written. blake2b, not ``hash()``,
    which Python salts per process."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if match is None:
            raise RecordsError(f"--shard {text!r} is not I/N; use e.g. --shard 0/4 (0-based)")
        return cls.of(int(match[1]), int(match[2]))

    @classmethod
    def of(cls, index: int, count: int) -> Shard:
        if count < 1 or not 0 <= index < count:
            raise RecordsError(
                f"shard {index}/{count} does not exist; the index runs from 0 to count - 1"
            )
        return cls(index, count)

    def owns(self, key: str) -> bool:
        if self.count == 1:
            return True
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.count == self.index


class RecordSource(Protocol):
    def count(self) -> int | None:
        """How many records the input holds, when that is cheap to know."""

    def __iter__(self) -> Iterator[Record]: ...

    def close(self) -> None: ...


class RecordSink(Protocol):
    where: str  # the path or table written, for messages

    def written(self) -> dict[str, bool]:
        """The keys already written, each True when it is an output (False: an error).
        Repairs what a kill left half-written first (a torn last line)."""

    def write(self, rows: Sequence[Row]) -> None:
        """Write one chunk: all of it durably, or (after a kill) none of it."""

    def drop_failed(self, keys: Collection[str]) -> None:
        """``--retry-failed``: remove the error rows of these keys (after ``written()``),
        so the run predicts them again as ids never written. Each file or transaction
        changes whole: a kill part-way leaves some dropped, which any rerun predicts."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class Location:
    format: str  # the module of its format, from formats.FORMATS
    target: str  # a path, or a SQLAlchemy URL
    table: str | None = None
    query: str | None = None
    database: bool = False  # a table or a query in a database, not a path

    def describe(self) -> str:
        if not self.database:
            return self.target
        return f"{masked(self.target)} ({'query' if self.query else 'table ' + str(self.table)})"


def refuse_overlap(source: Location, sink: Location, shard: Shard) -> None:
    """Refuse an output that is the input (or holds it, or is inside it), before
    anything is opened for writing: a run appends to, cuts the torn tail off and
    adds part files to its output, none of which an input may suffer."""
    if source.database or sink.database:
        if (source.target, source.table) == (sink.target, sink.table):
            raise RecordsError(
                f"--output-table {sink.table} is --input-table {source.table} of "
                f"{masked(sink.target)}: name another --output-table"
            )
        return
    given, output = Path(source.target), Path(sharded_path(sink.target, shard))
    if _same(given, output) or _within(given, output) or _within(output, given):
        raise RecordsError(
            f"--output {output} is (or holds, or is inside) --input {source.target}: a run "
            "writes to its output, so it must not be the input; name another --output"
        )


def _same(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)  # a symlink, a hard link, another spelling
    return a.resolve() == b.resolve()


def _within(inner: Path, outer: Path) -> bool:
    return outer.is_dir() and inner.resolve().is_relative_to(outer.resolve())


def sharded_path(path: str, shard: Shard) -> str:
    """An append-only file per shard: pods appending to one file would interleave."""
    if shard.count == 1:
        return path
    file = Path(path)
    return str(file.with_name(f"{file.stem}.shard-{shard.index}-of-{shard.count}{file.suffix}"))
