"""``serving-core batch`` end to end: the real CLI in a subprocess, over real files and tables."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.workload import SENTENCES
from serving_core.batch.command import cache_writer
from serving_core.batch.records import RecordsError
from serving_core.handler import Handler
from serving_core.settings import Settings
from tests.servers import ROOT, SERVING_CORE, base_env, wait_for

ECHO = str(ROOT / "handlers" / "echo")
MINILM = str(ROOT / "handlers" / "minilm")

# Doubles n. A record with "gate" waits until that file exists (so a run can be
# killed with chunks in flight); "die" kills its worker; n < 0 is InvalidInput, and
# so is a record with "flaky" until that file exists (a failure a retry can mend).
DOUBLER = """
import os
import time
from pathlib import Path

from serving_core import Handler, InvalidInput


class Doubler(Handler):
    input_schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
    }

    def predict_batch(self, items):
        outputs = []
        for item in items:
            while item.get("gate") and not Path(item["gate"]).exists():
                time.sleep(0.01)
            if item.get("die"):
                os._exit(3)
            if item["n"] < 0:
                outputs.append(InvalidInput("n must not be negative"))
            elif item.get("flaky") and not Path(item["flaky"]).exists():
                outputs.append(InvalidInput("flaky: its marker file is missing"))
            else:
                outputs.append({"double": item["n"] * 2})
        return outputs
"""


@pytest.fixture
def doubler(tmp_path):
    folder = tmp_path / "doubler"
    folder.mkdir()
    (folder / "handler.py").write_text(DOUBLER)
    return str(folder)


def batch_command(handler, *args, workers=2):
    return [str(SERVING_CORE), "batch", "--handler", handler, "--workers", str(workers), *args]


def batch(handler, *args, env=None, workers=2, timeout=180):
    return subprocess.run(
        batch_command(handler, *args, workers=workers),
        cwd=ROOT,
        env=base_env(env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_batch_modules_load_no_web_stack():
    modules = ", ".join(
        f"serving_core.{name}"
        for name in (
            "batch.command",
            "batch.flags",
            "batch.run",
            "batch.pool",
            "batch.progress",
            "batch.records",
            "batch.formats",
            "batch.textfiles",
            "batch.jsonlfiles",
            "batch.csvfiles",
            "batch.parquetfiles",
            "batch.sqltables",
            "engine.engine",
        )
    )
    probe = f"import sys, {modules}; print(sorted(sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(eval(result.stdout))  # a printed list of names
    assert not loaded & {"flask", "flask_restful", "werkzeug", "gunicorn", "gevent", "torch"}


def test_10000_records_give_10000_results(tmp_path, doubler):
    write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "n": i} for i in range(10_000)])
    result = batch(
        doubler, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")
    )
    assert result.returncode == 0, result.stderr
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert len(rows) == 10_000
    assert {row["id"]: row["output"]["double"] for row in rows} == {
        f"r{i}": 2 * i for i in range(10_000)
    }
    assert "10000 records written" in result.stderr


@pytest.mark.example("minilm")
@pytest.mark.model
def test_10000_sentences_give_10000_minilm_embeddings(tmp_path):
    sentences = [{"text": SENTENCES[i % len(SENTENCES)]} for i in range(10_000)]
    write_jsonl(tmp_path / "in.jsonl", sentences)
    result = batch(
        MINILM,
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(tmp_path / "out.jsonl"),
        timeout=290,
    )
    assert result.returncode == 0, result.stderr
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert sorted(row["id"] for row in rows) == list(range(10_000))  # positions as ids
    assert all(len(row["output"]["embedding"]) == 384 for row in rows)


def children_of(pid):
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry))
    return children


def test_a_run_killed_part_way_resumes_with_no_duplicates(tmp_path, doubler):
    gate = tmp_path / "open"
    records = [{"id": i, "n": i} for i in range(2000)]
    for record in records[1000:]:
        record["gate"] = str(gate)  # held until the gate opens: these are in flight
    write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    args = ("--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--chunk-size", "50")
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(
            batch_command(doubler, *args), cwd=ROOT, env=base_env({}), stderr=log
        )
    try:
        # Every chunk before the gate is written; the gated ones are in flight.
        wait_for(
            lambda: out.exists() and out.read_text().count("\n") >= 1000,
            "1,000 rows written",
            timeout_s=120,
        )
        workers = children_of(first.pid)
        assert workers
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    # The workers die with the parent: nothing is left writing or waiting.
    wait_for(
        lambda: not [pid for pid in workers if os.path.exists(f"/proc/{pid}")],
        "the pool workers to exit",
        timeout_s=30,
    )
    assert len(read_jsonl(out)) == 1000
    gate.touch()
    second = batch(doubler, *args)
    assert second.returncode == 0, second.stderr
    assert "1000 skipped as already written" in second.stderr
    ids = [row["id"] for row in read_jsonl(out)]
    assert sorted(ids) == list(range(2000))  # every record, none twice


def test_sigterm_mid_run_kills_the_busy_workers_and_exits_130_keeping_what_was_written(
    tmp_path, doubler
):
    gate = tmp_path / "never"  # never opened: only a kill frees the workers holding these
    records = [{"id": i, "n": i} for i in range(200)]
    for record in records[100:]:
        record["gate"] = str(gate)
    write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    args = ("--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--chunk-size", "50")
    with (tmp_path / "run.log").open("w") as log:
        command = batch_command(doubler, *args)
        run = subprocess.Popen(command, cwd=ROOT, env=base_env({}), stderr=log)
    try:
        wait_for(
            lambda: out.exists() and out.read_text().count("\n") >= 100,
            "100 rows written",
            timeout_s=120,
        )
        workers = children_of(run.pid)
        assert workers
        run.send_signal(signal.SIGTERM)  # to the parent alone, as a pod's deletion sends it
        assert run.wait(60) == 130
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    wait_for(
        lambda: not [pid for pid in workers if os.path.exists(f"/proc/{pid}")],
        "the pool workers to exit",
        timeout_s=30,
    )
    assert "interrupted after 100 records" in (tmp_path / "run.log").read_text()
    assert len(read_jsonl(out)) == 100


def test_bad_records_carry_their_error_and_the_run_goes_on(tmp_path, doubler):
    (tmp_path / "in.jsonl").write_text(
        '{"id": "ok", "n": 1}\n'
        "{not json\n"
        '{"id": "schema", "n": "one"}\n'
        '{"id": "negative", "n": -1}\n'
        '{"id": "ok2", "n": 2}\n'
    )
    result = batch(
        doubler, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")
    )
    assert result.returncode == 1, result.stderr
    rows = {row["id"]: row for row in read_jsonl(tmp_path / "out.jsonl")}
    assert rows["ok"] == {"id": "ok", "output": {"double": 2}}
    assert rows["ok2"] == {"id": "ok2", "output": {"double": 4}}
    assert rows[1]["error"]["type"] == "bad_request"
    assert "line 2 is not JSON" in rows[1]["error"]["message"]
    assert rows["schema"]["error"]["type"] == "invalid_input"
    assert "is not of type 'integer'" in rows["schema"]["error"]["message"]
    assert rows["negative"]["error"] == {
        "type": "invalid_input",
        "message": "n must not be negative",
    }
    assert all(("output" in row) != ("error" in row) for row in rows.values())
    # A rerun writes nothing, and still says that some records failed.
    again = batch(
        doubler, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")
    )
    assert again.returncode == 1
    assert "exit status 1: 3 records failed in an earlier run (this one wrote nothing)" in (
        again.stderr
    )
    assert "add --retry-failed to predict them again" in again.stderr
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 5


def write_records(kind, path, rows):
    if kind == "jsonl":
        write_jsonl(path, rows)
    elif kind == "csv":
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE reviews (id INTEGER PRIMARY KEY, text TEXT)")
            db.executemany(
                "INSERT INTO reviews VALUES (?, ?)", [(r["id"], r["text"]) for r in rows]
            )
        db.close()


def read_results(kind, path, table="results"):
    """{id: output or error} from any output, ids as text."""
    if kind == "jsonl":
        return {str(r["id"]): r.get("output", r.get("error")) for r in read_jsonl(path)}
    if kind == "csv":
        with path.open(newline="") as file:
            rows = list(csv.DictReader(file))
    elif kind == "parquet":
        rows = pq.read_table(path).to_pylist()
    else:
        with sqlite3.connect(path) as db:
            db.row_factory = sqlite3.Row
            rows = [dict(r) for r in db.execute(f"SELECT * FROM {table}")]
        db.close()
    return {r["id"]: json.loads(r["output"] or r["error"]) for r in rows}


SUFFIX = {"jsonl": "jsonl", "csv": "csv", "parquet": "parquet", "sqlite": "db"}


@pytest.mark.example("echo")
@pytest.mark.parametrize("kind", SUFFIX)
def test_every_format_in_and_out_gives_the_same_results(tmp_path, kind):
    rows = [{"id": i, "text": f"sentence {i}"} for i in range(300)]
    source, out = tmp_path / f"in.{SUFFIX[kind]}", tmp_path / f"out.{SUFFIX[kind]}"
    write_records(kind, source, rows)
    table = ["--input-table", "reviews"] if kind == "sqlite" else []
    result = batch(ECHO, "--input", str(source), *table, "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert read_results(kind, out) == {
        str(i): {"echo": {"text": f"sentence {i}"}} for i in range(300)
    }


def count_rows(kind, path, table="results"):
    if kind == "jsonl":
        return len(read_jsonl(path))
    if kind == "csv":
        with path.open(newline="") as file:
            return len(list(csv.DictReader(file)))
    if kind == "parquet":
        return pq.read_table(path).num_rows
    with sqlite3.connect(path) as db:
        (count,) = db.execute(f"SELECT count(*) FROM {table}").fetchone()
    db.close()
    return count


@pytest.mark.parametrize("kind", SUFFIX)
def test_retry_failed_predicts_the_failed_ids_again_and_writes_each_id_once(
    tmp_path, doubler, kind
):
    marker = tmp_path / "mended"
    rows = [{"id": i, "n": i} for i in range(10)]
    for row in rows[3], rows[7]:
        row["flaky"] = str(marker)
    write_jsonl(tmp_path / "in.jsonl", [*rows, {"id": 10, "n": -1}])
    out = tmp_path / f"out.{SUFFIX[kind]}"
    args = ("--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--chunk-size", "4")
    first = batch(doubler, *args)
    assert first.returncode == 1, first.stderr
    failed = {k for k, v in read_results(kind, out).items() if "type" in v}
    assert failed == {"3", "7", "10"}

    marker.touch()  # what failed now succeeds, but a plain rerun skips it
    assert batch(doubler, *args).returncode == 1
    assert {k for k, v in read_results(kind, out).items() if "type" in v} == failed

    retried = batch(doubler, *args, "--retry-failed")
    assert retried.returncode == 1, retried.stderr  # id 10 fails again, as it must
    assert "--retry-failed: 3 failed ids are predicted again" in retried.stderr
    results = read_results(kind, out)
    assert count_rows(kind, out) == len(results) == 11
    assert results == {
        **{str(i): {"double": 2 * i} for i in range(10)},
        "10": {"type": "invalid_input", "message": "n must not be negative"},
    }


@pytest.mark.example("echo")
def test_a_sqlite_table_in_and_out_of_one_file_resumes(tmp_path):
    data = tmp_path / "data.db"
    write_records("sqlite", data, [{"id": i, "text": f"s{i}"} for i in range(500)])
    with sqlite3.connect(data) as db:  # as if a killed run had committed 100 rows
        db.execute("CREATE TABLE results (id VARCHAR(255) PRIMARY KEY, output TEXT, error TEXT)")
        db.executemany(
            "INSERT INTO results VALUES (?, ?, NULL)",
            [(str(i), '{"echo": {"text": "earlier"}}') for i in range(100)],
        )
    db.close()
    args = ("--input", str(data), "--input-table", "reviews", "--output", f"sqlite:///{data}")
    result = batch(ECHO, *args, "--output-table", "results")
    assert result.returncode == 0, result.stderr
    results = read_results("sqlite", data)
    assert len(results) == 500
    assert results["0"] == {"echo": {"text": "earlier"}}
    assert results["499"] == {"echo": {"text": "s499"}}


def test_two_shards_write_every_record_exactly_once(tmp_path, doubler):
    write_jsonl(tmp_path / "in.jsonl", [{"id": i, "n": i} for i in range(1000)])
    out = tmp_path / "out.db"
    first = batch(
        doubler, "--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--shard", "0/2"
    )
    # The second as an Indexed Job's pod sees it: its index in the environment.
    second = batch(
        doubler,
        "--input",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(out),
        "--shards",
        "2",
        env={"JOB_COMPLETION_INDEX": "1"},
    )
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    with sqlite3.connect(out) as db:
        ids = [int(row[0]) for row in db.execute("SELECT id FROM results")]
    db.close()
    assert sorted(ids) == list(range(1000))
    counts = [int(r.stderr.split(" records written")[0].rsplit(" ", 1)[1]) for r in (first, second)]
    assert sum(counts) == 1000
    assert all(counts)


def test_a_worker_that_dies_fails_the_run(tmp_path, doubler):
    write_jsonl(tmp_path / "in.jsonl", [{"id": 0, "n": 0, "die": True}])
    result = batch(
        doubler, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")
    )
    assert result.returncode == 1
    assert "a worker process died" in result.stderr


@pytest.mark.example("echo")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "in.txt", "--output", "out.jsonl"], "cannot tell its format"),
        (["--input", "missing.jsonl", "--output", "out.jsonl"], "does not exist"),
        (["--input", "in.jsonl", "--output", "out.jsonl", "--shards", "2"], "JOB_COMPLETION_INDEX"),
        (["--input", "in.jsonl", "--output", "out.jsonl", "--shard", "3/2"], "does not exist"),
        (["--input", "in.db", "--output", "out.jsonl"], "--input-table"),
    ],
)
def test_a_configuration_error_exits_2_saying_what_to_fix(tmp_path, args, message):
    write_jsonl(tmp_path / "in.jsonl", [{"n": 1}])
    paths = [
        str(tmp_path / a) if "." in a and not a.startswith("-") and "/" not in a else a
        for a in args
    ]
    result = batch(ECHO, *paths)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.parametrize("output", ["in.jsonl", "link.jsonl"])
def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path, doubler, output):
    write_jsonl(tmp_path / "in.jsonl", [{"n": 1}, {"n": 2}])
    (tmp_path / "link.jsonl").symlink_to("in.jsonl")
    before = (tmp_path / "in.jsonl").read_bytes()
    result = batch(
        doubler, "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / output)
    )
    assert result.returncode == 2
    assert "must not be the input; name another --output" in result.stderr
    assert (tmp_path / "in.jsonl").read_bytes() == before


def test_a_broken_handler_exits_2(tmp_path):
    (tmp_path / "handler.py").write_text(
        textwrap.dedent(
            """
            from serving_core import Handler

            class Broken(Handler):
                def setup(self):
                    raise RuntimeError("no model file")

                def predict(self, item):
                    return {}
            """
        )
    )
    write_jsonl(tmp_path / "in.jsonl", [{"n": 1}])
    result = batch(
        str(tmp_path), "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl")
    )
    assert result.returncode == 2
    assert "no model file" in result.stderr


def test_warm_cache_with_api_keys_and_entries_per_key_is_refused_saying_how_to_share():
    keyed = Settings(cache_url="redis://127.0.0.1:1/0", api_keys=("k" * 16,))
    with pytest.raises(RecordsError, match="SERVING_CACHE_PER_KEY=false"):
        cache_writer(keyed, Handler())
    assert cache_writer(dataclasses.replace(keyed, cache_per_key=False), Handler())
