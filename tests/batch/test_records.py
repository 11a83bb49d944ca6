"""Records in and rows out of every format: round trips, resume, torn tails, shards."""

from __future__ import annotations

import csv
import json
import re
import sqlite3

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from serving_core import encoding
from serving_core.batch.formats import input_location, open_sink, open_source, output_location
from serving_core.batch.records import Record, RecordsError, Row, Shard, id_key, refuse_overlap

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
def test_drop_failed_removes_only_the_chosen_error_rows_and_the_sink_writes_on(tmp_path, kind):
    path = tmp_path / f"out.{SUFFIXES[kind]}"
    sink = sink_for(kind, path)
    sink.written()
    sink.write([ok_row(0), error_row(1), error_row(2)])
    sink.write([error_row(3), ok_row(4)])
    sink.close()
    again = sink_for(kind, path)
    assert again.written() == {"0": True, "1": False, "2": False, "3": False, "4": True}
    again.drop_failed({"1", "3", "4"})  # 4 succeeded: it stays
    again.write([ok_row(1), ok_row(3)])
    again.close()
    assert written_in(kind, path) == {"0": True, "1": True, "2": False, "3": True, "4": True}


def test_a_sharded_parquet_retry_refuses_parts_of_another_shard_count(tmp_path):
    path = tmp_path / "out.parquet"
    sink = sink_for("parquet", path)  # written unsharded: part-0of1-*
    sink.written()
    sink.write([error_row(i) for i in range(8)])
    before = sorted(p.name for p in path.iterdir())
    shard = Shard(0, 2)
    sharded = sink_for("parquet", path, shard)
    done = sharded.written()
    with pytest.raises(RecordsError, match="another shard count wrote"):
        sharded.drop_failed({key for key in done if shard.owns(key)})
    assert sorted(p.name for p in path.iterdir()) == before
    assert written_in("parquet", path) == {str(i): False for i in range(8)}


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


def finished_output(kind, path, keys=(0, 1, 2)):
    sink = sink_for(kind, path)
    sink.written()
    sink.write([ok_row(key) for key in keys])
    sink.close()


def snapshot(path):
    """Every file of an output (a file, or a directory's parts and temporaries) and its bytes."""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    return {file.name: file.read_bytes() for file in files}


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet"])
def test_a_rerun_with_another_id_field_is_refused_and_changes_no_byte(tmp_path, kind):
    path = tmp_path / f"out.{kind}"
    finished_output(kind, path)
    if kind == "parquet":
        (path / ".part-0of1-000003.parquet.tmp").write_bytes(b"PAR1 half")
    else:
        with path.open("ab") as file:
            file.write(b"{torn")
    before = snapshot(path)
    sink = open_sink(output_location(str(path)), "review_id", WHOLE)
    with pytest.raises(RecordsError, match="--id-field"):
        sink.written()
    sink.close()
    assert snapshot(path) == before


@pytest.mark.parametrize(
    ("kind", "bad", "line"),
    [
        ("jsonl", b'{"id": 1, "output": {"ec\n', 2),  # torn, but rows follow it
        ("jsonl", b"\x00\x00\x00\n", 2),
        ("jsonl", b'{"text": "an input row"}\n', 2),
        ("jsonl", b'{"id": 1, "text": "an input row"}\n', 2),
        ("csv", b"1,too,many,fields\n", 3),
        ("csv", b"1,too few\n", 3),
    ],
)
def test_a_malformed_row_before_the_last_stops_the_run_naming_it_and_changes_no_byte(
    tmp_path, kind, bad, line
):
    path = tmp_path / f"out.{kind}"
    finished_output(kind, path, keys=[0])
    with path.open("ab") as file:
        file.write(bad)
    finished_output(kind, tmp_path / f"more.{kind}", keys=[2, 3])
    with path.open("ab") as file:  # whole rows after the bad one
        more = (tmp_path / f"more.{kind}").read_bytes()
        file.write(more.split(b"\n", 1)[1] if kind == "csv" else more)
    before = path.read_bytes()
    sink = sink_for(kind, path)
    with pytest.raises(RecordsError, match=f"{path}:{line}: .*(Fix|fix) or delete"):
        sink.written()
    sink.close()
    assert path.read_bytes() == before


def test_a_csv_output_whose_one_line_is_no_header_is_refused_not_cut(tmp_path):
    path = tmp_path / "out.csv"
    path.write_bytes(b"name,value")
    with pytest.raises(RecordsError, match="has the columns name,value"):
        written_in("csv", path)
    assert path.read_bytes() == b"name,value"


@pytest.mark.parametrize("cut", [10, -10])
def test_a_truncated_parquet_part_names_the_part_and_the_fix(tmp_path, cut):
    path = tmp_path / "out.parquet"
    finished_output("parquet", path, keys=[0])
    finished_output("parquet", path, keys=[1])
    part = path / "part-0of1-000001.parquet"
    part.write_bytes(part.read_bytes()[:cut])
    with pytest.raises(RecordsError, match=f"the part {part} cannot be read.*rm '{part}'"):
        written_in("parquet", path)
    part.unlink()  # the fix the message gives
    assert written_in("parquet", path) == {"0": True}


def test_parquet_parts_are_fsynced_before_and_after_their_rename(tmp_path, monkeypatch):
    import os

    from serving_core.batch import durable

    events = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(descriptor):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{descriptor}")))
        fsync(descriptor)

    def record_replace(source, target):
        events.append(("rename", str(target)))
        replace(source, target)

    monkeypatch.setattr(durable.os, "fsync", record_fsync)
    monkeypatch.setattr(durable.os, "replace", record_replace)
    path = tmp_path / "out.parquet"
    sink = sink_for("parquet", path)
    sink.written()
    events.clear()
    sink.write([ok_row(0)])
    part = str(path / "part-0of1-000000.parquet")
    (temporary,) = [name for event, name in events if event == "fsync" and name.endswith(".tmp")]
    assert re.fullmatch(
        re.escape(str(path / ".part-0of1-000000.parquet.")) + r"\w+\.tmp", temporary
    )
    assert events == [
        ("fsync", temporary),
        ("rename", part),
        ("fsync", str(path)),
    ]


@pytest.mark.parametrize(
    ("given", "output"),
    [
        ("in.jsonl", "in.jsonl"),
        ("in.jsonl", "./sub/../in.jsonl"),
        ("in.jsonl", "link.jsonl"),  # a symlink to the input
        ("in.parquet", "in.parquet"),
        ("folder.parquet/a.parquet", "folder.parquet"),
    ],
)
def test_an_output_that_is_the_input_is_refused(tmp_path, monkeypatch, given, output):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    write_input("jsonl", tmp_path / "in.jsonl", [{"id": 0}])
    write_input("parquet", tmp_path / "in.parquet", [{"id": 0}])
    (tmp_path / "folder.parquet").mkdir()
    write_input("parquet", tmp_path / "folder.parquet" / "a.parquet", [{"id": 0}])
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "in.jsonl")
    with pytest.raises(RecordsError, match="must not be the input; name another --output"):
        refuse_overlap(input_location(given), output_location(output), WHOLE)


def test_an_output_beside_the_input_is_allowed(tmp_path):
    write_input("jsonl", tmp_path / "in.jsonl", [{"id": 0}])
    refuse_overlap(
        input_location(str(tmp_path / "in.jsonl")),
        output_location(str(tmp_path / "in.jsonl")),
        Shard.parse("0/2"),  # the output is in.shard-0-of-2.jsonl
    )
    refuse_overlap(
        input_location(str(tmp_path / "in.jsonl")),
        output_location(str(tmp_path / "out.jsonl")),
        WHOLE,
    )
