"""Opens a location (``records.Location``) with its format's ``Source`` or ``Sink``.

Above the formats, which import only the types in ``records``. Parquet and SQL
are imported when a location of theirs is opened: pyarrow and SQLAlchemy take
about a second to import, which a JSONL batch should not pay.
"""

from __future__ import annotations

from serving_core.batch.records import (
    DEFAULT_OUTPUT_TABLE,
    Location,
    Shard,
    Sink,
    Source,
    sharded_path,
)
from serving_core.batch.textfiles import CsvSink, CsvSource, JsonlSink, JsonlSource


def open_source(location: Location, id_field: str) -> Source:
    if location.kind == "jsonl":
        return JsonlSource(location.target, id_field)
    if location.kind == "csv":
        return CsvSource(location.target, id_field)
    if location.kind == "parquet":
        from serving_core.batch.parquetfiles import ParquetSource

        return ParquetSource(location.target, id_field)
    from serving_core.batch.sqltables import SqlSource

    return SqlSource(location.target, id_field, table=location.table, query=location.query)


def open_sink(location: Location, id_field: str, shard: Shard) -> Sink:
    if location.kind == "jsonl":
        return JsonlSink(sharded_path(location.target, shard), id_field)
    if location.kind == "csv":
        return CsvSink(sharded_path(location.target, shard), id_field)
    if location.kind == "parquet":
        from serving_core.batch.parquetfiles import ParquetSink

        return ParquetSink(location.target, id_field, shard)
    from serving_core.batch.sqltables import SqlSink

    return SqlSink(location.target, id_field, location.table or DEFAULT_OUTPUT_TABLE)
