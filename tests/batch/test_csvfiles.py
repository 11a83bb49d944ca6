"""A CSV input as ``serving-core batch`` reads it: a torn file is never predicted mangled."""

from __future__ import annotations

import pytest

from tests.batch.test_batch import ECHO, batch, read_jsonl

TORN = 'id,text\n1,hello\n2,"two\nlines"\n\n3,"torn at the end\n4,swallowed\n'


@pytest.mark.example("echo")
def test_a_torn_csv_rows_unclosed_quote_fails_that_row_naming_its_lines(tmp_path):
    """From the new user's walk: a CSV whose last row opens a quote and never closes it
    (a copy cut short) was predicted with the rest of the file as one mangled value."""
    source, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    source.write_text(TORN)
    result = batch(ECHO, "--input", str(source), "--output", str(out))
    assert result.returncode == 1, result.stderr  # a record failed
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert rows["1"]["output"] == {"echo": {"text": "hello"}}
    assert rows["2"]["output"] == {"echo": {"text": "two\nlines"}}  # a quoted newline is fine
    assert rows["3"]["error"]["type"] == "bad_request"
    message = rows["3"]["error"]["message"]
    assert message.startswith("line 6: the row starting here has a quoted field that is never")
    assert "lines 6-7 (the rest of the file)" in message
    assert len(rows) == 3


@pytest.mark.example("echo")
def test_a_csv_header_with_an_unclosed_quote_is_refused_naming_the_file(tmp_path):
    source, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    source.write_text('id,"text\n1,hello\n')
    result = batch(ECHO, "--input", str(source), "--output", str(out))
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"serving-core: error: --input {source}: the header (line 1) opens a quote"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.example("echo")
def test_a_csv_with_a_whole_last_row_and_no_final_newline_is_predicted(tmp_path):
    source, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    source.write_text('id,text\n1,"a, quoted"\n2,b')
    result = batch(ECHO, "--input", str(source), "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert {row["id"]: row["output"] for row in read_jsonl(out)} == {
        "1": {"echo": {"text": "a, quoted"}},
        "2": {"echo": {"text": "b"}},
    }


@pytest.mark.example("echo")
def test_a_csv_row_that_cannot_be_a_record_fails_under_its_own_id(tmp_path):
    """Its position was its id: row 2's position 1 is record 1's id, and it was skipped as
    a repeat, its error written nowhere."""
    source, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    source.write_text("id,text\n1,a\n7,b,extra\n")
    result = batch(ECHO, "--input", str(source), "--output", str(out))
    assert result.returncode == 1, result.stderr
    rows = {row["id"]: row for row in read_jsonl(out)}
    assert rows["1"]["output"] == {"echo": {"text": "a"}}
    assert rows["7"]["error"]["message"] == "line 3 has more fields than the header"
