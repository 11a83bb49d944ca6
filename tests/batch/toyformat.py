"""A batch format for a test-only suffix, ``.toy``: what a new format is (a module with
``batch.formats.Format``'s names), here JSON lines under another name."""

from __future__ import annotations

from serving_core.batch.jsonlfiles import JsonlSink, JsonlSource
from serving_core.batch.records import Location, RecordSink, RecordSource, Shard, sharded_path

DATABASE = False


def open_source(location: Location, id_field: str) -> RecordSource:
    return JsonlSource(location.target, id_field)


def open_sink(location: Location, id_field: str, shard: Shard) -> RecordSink:
    return JsonlSink(sharded_path(location.target, shard), id_field)
