"""The batch formats are one table (``batch.formats.FORMATS``): a suffix not in it is
refused with the table's suffixes, each format is imported only when used, and a format
added with one module and one table line reads and writes."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from serving_core.batch.formats import (
    FORMATS,
    input_location,
    open_sink,
    open_source,
    output_location,
)
from serving_core.batch.records import RecordsError, Row, Shard


@pytest.mark.parametrize("key", FORMATS)
def test_every_line_names_a_module_with_the_format_interface(key):
    form = importlib.import_module(FORMATS[key])
    assert isinstance(form.DATABASE, bool)
    assert callable(form.open_source)
    assert callable(form.open_sink)


def test_an_unknown_suffix_is_refused_with_the_tables_suffixes(tmp_path):
    with pytest.raises(RecordsError) as info:
        output_location(str(tmp_path / "out.avro"))
    message = str(info.value)
    assert "cannot tell its format from the suffix" in message
    assert all(key in message for key in FORMATS if key.startswith("."))


def test_a_jsonl_location_imports_neither_pyarrow_nor_sqlalchemy(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": 1}\n')
    probe = (
        "import sys\n"
        "from serving_core.batch.formats import input_location, open_source\n"
        f"open_source(input_location({str(path)!r}), 'id').close()\n"
        "print(sorted(m for m in ('pyarrow', 'sqlalchemy') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_a_format_is_one_module_and_one_table_line(monkeypatch, tmp_path):
    source, out = tmp_path / "in.toy", tmp_path / "out.toy"
    source.write_text("".join(json.dumps({"id": i, "text": f"t{i}"}) + "\n" for i in range(3)))
    with pytest.raises(RecordsError, match="cannot tell its format"):
        input_location(str(source))  # no table line yet
    monkeypatch.setitem(FORMATS, ".toy", "tests.batch.toyformat")
    reader = open_source(input_location(str(source)), "id")
    try:
        records = list(reader)
    finally:
        reader.close()
    assert [(record.key, record.params) for record in records] == [
        (str(i), {"text": f"t{i}"}) for i in range(3)
    ]
    sink = open_sink(output_location(str(out)), "id", Shard())
    try:
        assert sink.written() == {}
        sink.write([Row(r.id, r.key, output=json.dumps(r.params).encode()) for r in records])
    finally:
        sink.close()
    again = open_sink(output_location(str(out)), "id", Shard())
    try:
        assert again.written() == {"0": True, "1": True, "2": True}
    finally:
        again.close()
