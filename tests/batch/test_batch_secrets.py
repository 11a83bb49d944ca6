"""A database password never reaches a batch run's output: URLs are logged and printed."""

from __future__ import annotations

import pytest

from serving_core.batch.formats import input_location, output_location
from tests.batch.test_batch import ECHO, batch, write_jsonl

PASSWORD = "hunter2-s3cret"
# psycopg is not installed (a missing driver), and nothing listens on port 1.
POSTGRES = f"postgresql+psycopg://reader:{PASSWORD}@127.0.0.1:1/reviews"
SQLITE = f"sqlite://reader:{PASSWORD}@/in.db"  # SQLite takes no password: refused


@pytest.mark.example("echo")  # runs handlers/echo: skipped where a new owner deleted it
@pytest.mark.parametrize(
    "args",
    [
        ["--input", POSTGRES, "--input-table", "reviews", "--output", "out.jsonl"],
        ["--input", "in.jsonl", "--output", POSTGRES],
        ["--input", POSTGRES, "--output", "out.jsonl"],  # no --input-table
        ["--input", SQLITE, "--input-table", "t", "--output", "o.jsonl"],
    ],
    ids=["missing-driver-in", "missing-driver-out", "no-table", "bad-sqlite-url"],
)
def test_a_failed_batch_run_never_shows_the_database_password(tmp_path, args):
    write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "n": 1}])
    paths = [str(tmp_path / a) if a.endswith(".jsonl") else a for a in args]
    result = batch(ECHO, *paths, env={"SERVING_LOG_LEVEL": "debug"})
    assert result.returncode == 2
    assert "reader:***@" in result.stderr  # the URL is still named, so the user can fix it
    assert PASSWORD not in result.stdout + result.stderr


def test_the_run_line_names_a_database_without_its_password():
    # What the INFO line at the start of a run logs for each side.
    source = input_location(POSTGRES, table="reviews")
    sink = output_location(POSTGRES)
    for shown in (source.describe(), sink.describe()):
        assert PASSWORD not in shown
        assert "reader:***@127.0.0.1:1/reviews" in shown
