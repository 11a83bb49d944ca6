"""Records in and rows out of every format: round trips, resume, torn tails, shards."""

from __future__ import annotations

import csv
import json
import sqlite3

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from serving_core import encoding
from serving_core.batch.formats import open_sink, open_source
from serving_core.batch.records import (
    Record,
    RecordsError,
    Row,
    Shard,
    id_key,
    input_location,
    output_location,
)

WHOLE = Shard()
SUFFIXES = {"jsonl": "jsonl", "csv": "csv", "parquet": "parquet", "sqlite": "db"}


def write_input(kind, path, rows):
    if kind == "jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif kind == "csv":
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with sqlite3.connect(path) as db:
            columns = list(rows[0])
            db.execute(f"CREATE TABLE reviews ({', '.join(columns)})")
            db.executemany(
                f"INSERT INTO reviews VALUES ({', '.join('?' for _ in columns)})",
                [tuple(row.values()) for row in rows],
            )
        db.close()


def read_input(kind, path, id_field="id"):
    location = input_location(str(path), table="reviews" if kind == "sqlite" else None)
    source = open_source(location, id_field)
    try:
        return source.count(), list(source)
    finally:
        source.close()


def sink_for(kind, path, shard=WHOLE):
    location = output_location(str(path), table="results" if kind == "sqlite" else None)
    return open_sink(location, "id", shard)


def written_in(kind, path, shard=WHOLE):
    sink = sink_for(kind, path, shard)
    try:
        return sink.written()
    finally:
        sink.close()


def ok_row(key, text="x"):
    return Row(int(key), str(key), output=encoding.dumps({"echo": text}))


def error_row(key):
    return Row(int(key), str(key), error=b'{"type":"invalid_input","message":"no"}')


@pytest.mark.parametrize("kind", SUFFIXES)
def test_a_source_reads_every_record_with_its_id_and_params_without_it(tmp_path, kind):
    path = tmp_path / f"in.{SUFFIXES[kind]}"
    write_input(kind, path, [{"id": i, "text": f"t{i}"} for i in range(5)])
    count, records = read_input(kind, path)
    assert count == 5
    assert [r.key for r in records] == ["0", "1", "2", "3", "4"]
    assert [r.params for r in records] == [{"text": f"t{i}"} for i in range(5)]
    assert all(r.error is None for r in records)


@pytest.mark.parametrize("kind", SUFFIXES)
def test_records_without_an_id_get_their_position(tmp_path, kind):
    path = tmp_path / f"in.{SUFFIXES[kind]}"
    write_input(kind, path, [{"text": f"t{i}"} for i in range(3)])
    _, records = read_input(kind, path)
    assert [(r.id, r.key) for r in records] == [(0, "0"), (1, "1"), (2, "2")]


@pytest.mark.parametrize("kind", SUFFIXES)
def test_a_sink_remembers_what_it_wrote_and_whether_it_failed(tmp_path, kind):
    path = tmp_path / f"out.{SUFFIXES[kind]}"
    sink = sink_for(kind, path)
    assert sink.written() == {}
    sink.write([ok_row(0), error_row(1)])
    sink.write([ok_row(2)])
    sink.close()
    again = sink_for(kind, path)
    assert again.written() == {"0": True, "1": False, "2": True}
    again.write([ok_row(3)])
    again.close()
    assert written_in(kind, path) == {"0": True, "1": False, "2": True, "3": True}


def test_jsonl_rows_hold_the_id_and_the_output_or_the_error(tmp_path):
    sink = sink_for("jsonl", tmp_path / "out.jsonl")
    sink.written()
    sink.write([ok_row(0, "a"), error_row(1)])
    sink.close()
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert rows == [
        {"id": 0, "output": {"echo": "a"}},
        {"id": 1, "error": {"type": "invalid_input", "message": "no"}},
    ]


def test_csv_rows_hold_the_output_or_the_error_as_json(tmp_path):
    sink = sink_for("csv", tmp_path / "out.csv")
    sink.written()
    sink.write([ok_row(0, "a,\nb"), error_row(1)])
    sink.close()
    with (tmp_path / "out.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert [r["id"] for r in rows] == ["0", "1"]
    assert json.loads(rows[0]["output"]) == {"echo": "a,\nb"}
    assert rows[0]["error"] == ""
    assert rows[1]["output"] == ""
    assert json.loads(rows[1]["error"])["type"] == "invalid_input"


@pytest.mark.parametrize(
    ("kind", "torn"),
    [
        ("jsonl", b'{"id": 3, "output": {"ec'),
        ("jsonl", b"\x00\x00\x00\n"),
        ("csv", b'3,"{""echo'),
        ("csv", b'3,"{""echo"": ""a\n'),  # cut inside a quoted field after its newline
    ],
)
def test_a_torn_last_row_from_a_kill_is_cut_off_and_rewritten_once(tmp_path, kind, torn):
    path = tmp_path / f"out.{kind}"
    sink = sink_for(kind, path)
    sink.written()
    sink.write([ok_row(0), ok_row(1), ok_row(2, "two\nlines")])
    sink.close()
    with path.open("ab") as file:
        file.write(torn)
    resumed = sink_for(kind, path)
    assert resumed.written() == {"0": True, "1": True, "2": True}
    resumed.write([ok_row(3)])
    resumed.close()
    assert written_in(kind, path) == {"0": True, "1": True, "2": True, "3": True}
    if kind == "jsonl":
        assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [0, 1, 2, 3]


def test_a_csv_output_with_other_columns_is_refused(tmp_path):
    (tmp_path / "out.csv").write_text("name,value\na,1\n")
    with pytest.raises(RecordsError, match="has the columns name,value"):
        written_in("csv", tmp_path / "out.csv")


def test_a_parquet_part_caught_mid_write_is_removed_and_numbering_continues(tmp_path):
    path = tmp_path / "out.parquet"
    sink = sink_for("parquet", path)
    sink.written()
    sink.write([ok_row(0)])
    (path / ".part-0of1-000001.parquet.tmp").write_bytes(b"PAR1 half")
    resumed = sink_for("parquet", path)
    assert resumed.written() == {"0": True}
    resumed.write([ok_row(1)])
    resumed.close()
    assert sorted(p.name for p in path.iterdir()) == [
        "part-0of1-000000.parquet",
        "part-0of1-000001.parquet",
    ]
    table = pq.read_table(path)
    assert sorted(table.column("id").to_pylist()) == ["0", "1"]


def test_a_parquet_directory_is_read_as_one_input(tmp_path):
    folder = tmp_path / "in.parquet"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([{"id": 0, "text": "a"}]), folder / "a.parquet")
    pq.write_table(pa.Table.from_pylist([{"id": 1, "text": "b"}]), folder / "b.parquet")
    count, records = read_input("parquet", folder)
    assert count == 2
    assert [r.params["text"] for r in records] == ["a", "b"]


def test_a_sql_output_table_with_other_columns_is_refused(tmp_path):
    with sqlite3.connect(tmp_path / "out.db") as db:
        db.execute("CREATE TABLE results (name TEXT)")
    db.close()
    with pytest.raises(RecordsError, match="without the columns error, id, output"):
        sink_for("sqlite", tmp_path / "out.db")


def test_a_sql_query_is_an_input(tmp_path):
    write_input("sqlite", tmp_path / "in.db", [{"id": i, "text": f"t{i}"} for i in range(4)])
    location = input_location(
        f"sqlite:///{tmp_path / 'in.db'}", query="SELECT id, text FROM reviews WHERE id >= 2"
    )
    source = open_source(location, "id")
    assert source.count() is None
    assert [r.key for r in source] == ["2", "3"]
    source.close()


def test_input_and_output_can_share_one_sqlite_file(tmp_path):
    path = tmp_path / "data.db"
    write_input("sqlite", path, [{"id": i, "text": f"t{i}"} for i in range(3000)])
    sink = sink_for("sqlite", path)
    sink.written()
    source = open_source(input_location(str(path), table="reviews"), "id")
    chunk = []
    for record in source:  # the read stays open while chunks commit
        chunk.append(ok_row(record.key))
        if len(chunk) == 500:
            sink.write(chunk)
            chunk = []
    source.close()
    assert len(sink.written()) == 3000
    sink.close()


def test_a_jsonl_line_that_is_not_an_object_is_a_bad_record_in_its_place(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{not json\n\n[1, 2]\n{"text": "y"}\n')
    _, records = read_input("jsonl", path)
    assert [r.key for r in records] == ["a", "1", "2", "3"]
    assert records[1].error is not None
    assert records[1].error["message"].startswith("line 2 is not JSON")
    assert records[2].error == {
        "type": "bad_request",
        "message": "line 4 is a JSON list, not an object",
    }
    assert records[3] == Record(3, "3", {"text": "y"})


def test_ids_compare_as_text():
    assert id_key(7) == id_key("7") == "7"


@pytest.mark.parametrize(
    ("value", "table", "query", "message"),
    [
        ("in.txt", None, None, "cannot tell its format"),
        ("sqlite:///x.db", None, None, "give one of --input-table"),
        ("sqlite:///x.db", "t", "SELECT 1", "give one of --input-table"),
        ("missing.jsonl", None, None, "does not exist"),
        ("missing.jsonl", "t", None, "are for databases"),
    ],
)
def test_a_bad_input_location_says_how_to_fix_it(value, table, query, message):
    with pytest.raises(RecordsError, match=message):
        input_location(value, table, query)


@pytest.mark.parametrize(("text", "message"), [("1", "is not I/N"), ("2/2", "does not exist")])
def test_a_bad_shard_says_how_to_fix_it(text, message):
    with pytest.raises(RecordsError, match=message):
        Shard.parse(text)


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "sqlite"])
def test_two_shards_of_1000_records_write_every_record_exactly_once(tmp_path, kind):
    path = tmp_path / f"in.{SUFFIXES[kind]}"
    write_input(kind, path, [{"id": i, "text": f"t{i}"} for i in range(1000)])
    out = tmp_path / f"out.{'db' if kind == 'sqlite' else kind}"
    shards = [Shard.parse(f"{index}/2") for index in range(2)]
    for shard in shards:
        _, records = read_input(kind, path)
        sink = sink_for(kind, out, shard)
        sink.written()
        sink.write([ok_row(r.key) for r in records if shard.owns(r.key)])
        sink.close()
    written = [set(written_in(kind, out, shard)) for shard in shards]
    if kind in ("jsonl", "csv"):  # a file per shard: pods must not append to one file
        assert sorted(p.name for p in tmp_path.glob("out.*")) == [
            f"out.shard-0-of-2.{kind}",
            f"out.shard-1-of-2.{kind}",
        ]
        mine = written
    else:  # one table or directory; each shard sees both shards' rows
        assert written[0] == written[1]
        mine = [{k for k in written[0] if shard.owns(k)} for shard in shards]
    assert not mine[0] & mine[1]
    assert mine[0] | mine[1] == {str(i) for i in range(1000)}
    assert 400 < len(mine[0]) < 600
