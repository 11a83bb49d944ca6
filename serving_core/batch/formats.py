"""The batch formats, one table: ``FORMATS`` maps a path's suffix, or a URL's scheme, to
the module of its format; ``input_location`` and ``output_location`` find it, and
``open_source`` and ``open_sink`` open a location with it.

A format's module has what ``Format`` names. Each is imported only when a
location of its kind is given: pyarrow and SQLAlchemy take about a second to
import, which a JSONL batch should not pay. A new format is a module and a line
here. Above the formats, which import only the types in ``records``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol, cast

from serving_core.batch.records import (
    DEFAULT_OUTPUT_TABLE,
    Location,
    RecordsError,
    RecordSink,
    RecordSource,
    Shard,
)
from serving_core.settings.secrets import masked

_JSONL = "serving_core.batch.jsonlfiles"
_PARQUET = "serving_core.batch.parquetfiles"
_SQL = "serving_core.batch.sqltables"

FORMATS: dict[str, str] = {
    ".jsonl": _JSONL,
    ".ndjson": _JSONL,
    ".csv": "serving_core.batch.csvfiles",
    ".parquet": _PARQUET,
    ".pq": _PARQUET,
    ".db": _SQL,  # a SQLite file
    ".sqlite": _SQL,
    ".sqlite3": _SQL,
    "://": _SQL,  # a URL of a scheme not named here: a SQLAlchemy database
}


class Format(Protocol):
    """What a format's module provides (a module, not a class: its names)."""

    DATABASE: bool  # its locations are a table or a query in a database, not paths

    def open_source(self, location: Location, id_field: str) -> RecordSource: ...

    def open_sink(self, location: Location, id_field: str, shard: Shard) -> RecordSink: ...


def input_location(value: str, table: str | None = None, query: str | None = None) -> Location:
    name, form = _format(value, "--input")
    if form.DATABASE:
        if (table is None) == (query is None):
            raise RecordsError(
                f"--input {masked(value)} is a database: give one of --input-table TABLE "
                "or --input-query 'SELECT ...'"
            )
        return Location(name, _database(value), table, query, database=True)
    if table is not None or query is not None:
        raise RecordsError(
            f"--input-table and --input-query are for databases; --input {value} is a file"
        )
    if not Path(value).exists():
        raise RecordsError(f"--input {value} does not exist")
    return Location(name, value)


def output_location(value: str, table: str | None = None) -> Location:
    name, form = _format(value, "--output")
    if form.DATABASE:
        return Location(name, _database(value), table or DEFAULT_OUTPUT_TABLE, database=True)
    if table is not None:
        raise RecordsError(f"--output-table is for databases; --output {value} is a file")
    return Location(name, value)


def open_source(location: Location, id_field: str) -> RecordSource:
    return _module(location.format).open_source(location, id_field)


def open_sink(location: Location, id_field: str, shard: Shard) -> RecordSink:
    return _module(location.format).open_sink(location, id_field, shard)


def _format(value: str, flag: str) -> tuple[str, Format]:
    if "://" in value:
        scheme = value.partition("://")[0].lower() + "://"
        key = scheme if scheme in FORMATS else "://"
    else:
        key = Path(value).suffix.lower()
    if key not in FORMATS:
        known = ", ".join(name for name in FORMATS if name.startswith("."))
        raise RecordsError(
            f"{flag} {value}: cannot tell its format from the suffix; use one of {known}, "
            "or a SQLAlchemy URL such as postgresql://host/db"
        )
    return FORMATS[key], _module(FORMATS[key])


def _module(name: str) -> Format:
    return cast(Format, importlib.import_module(name))


def _database(value: str) -> str:
    # A database format given a path, not a URL: a SQLite file (by its suffix).
    return value if "://" in value else f"sqlite:///{Path(value).resolve()}"
