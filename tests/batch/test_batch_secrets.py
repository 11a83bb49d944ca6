"""A database password never reaches a batch run's output: URLs are logged and printed."""

from __future__ import annotations

from urllib.parse import quote

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


SLASHED = "hunter2/s3cret@x"  # a raw '/' and '@': what people leave unescaped
SLASHED_URL = f"postgresql+psycopg://reader:{SLASHED}@127.0.0.1:1/reviews"


@pytest.mark.example("echo")
@pytest.mark.parametrize(
    "args",
    [
        ["--input", SLASHED_URL, "--input-table", "reviews", "--output", "out.jsonl"],
        ["--input", "in.jsonl", "--output", SLASHED_URL],
    ],
    ids=["in", "out"],
)
def test_i1_a_password_holding_a_slash_is_never_shown(tmp_path, args):
    """I1: batch printed a password containing '/' (its masker stopped at the '/')."""
    write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "n": 1}])
    paths = [str(tmp_path / a) if a.endswith(".jsonl") else a for a in args]
    result = batch(ECHO, *paths, env={"SERVING_LOG_LEVEL": "debug"})
    assert result.returncode == 2
    assert "reader:***@127.0.0.1:1/reviews" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr


@pytest.mark.example("echo")
@pytest.mark.parametrize("flag", ["--input", "--output"])
def test_i1_a_port_that_is_no_number_is_one_line_naming_the_flag_and_the_fix(tmp_path, flag):
    """I1: a non-numeric port was a traceback; it is one line naming the flag, the URL
    masked, and what to fix."""
    write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "n": 1}])
    url = f"postgresql://reader:{SLASHED}@127.0.0.1:5432x/reviews"
    args = {"--input": [url, "--input-table", "t"], "--output": [str(tmp_path / "in.jsonl")]}
    out = url if flag == "--output" else str(tmp_path / "out.jsonl")
    result = batch(ECHO, "--input", *args[flag], "--output", out)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"serving-core: error: {flag} postgresql://reader:***@127.0.0.1:5432x/reviews: "
        "the port after HOST: is not a number; fix it, and percent-encode"
    )
    assert "s3cret" not in result.stdout + result.stderr


@pytest.mark.example("echo")
def test_m3_warm_cache_logs_a_unix_redis_without_its_query_password(tmp_path):
    """M3: the cache's store named a ``unix://`` Redis with its ``?password=`` in its
    warnings; a --warm-cache run against one that is down logs them."""
    write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "a"}])
    cache = f"unix://{tmp_path}/none.sock?db=0&password={quote(SLASHED)}"
    args = ("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"))
    result = batch(ECHO, *args, "--warm-cache", env={"SERVING_CACHE_URL": cache})
    assert result.returncode == 0, result.stderr
    assert f"cache redis: unix://{tmp_path}/none.sock?db=0&password=***: " in result.stderr
    assert "s3cret" not in result.stdout + result.stderr


@pytest.mark.example("echo")
@pytest.mark.parametrize(
    ("cache", "fault"),
    [
        (f"redis://:{quote(SLASHED)}@127.0.0.1:63x79/0", "has a port that is not 0..65535"),
        (f"unix:///run/r.sock?db=first&password={quote(SLASHED)}", "has ?db='first', which is"),
    ],
)
def test_i1_warm_caches_redis_url_that_redis_py_refuses_names_the_setting(tmp_path, cache, fault):
    """I1: a number redis-py cannot read in SERVING_CACHE_URL was its own message ("Invalid
    value for 'db' in connection URL."), naming no setting."""
    write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "text": "a"}])
    args = ("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl"))
    result = batch(ECHO, *args, "--warm-cache", env={"SERVING_CACHE_URL": cache})
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("serving-core: error: SERVING_CACHE_URL=")
    assert fault in line
    assert "s3cret" not in result.stdout + result.stderr
