"""``--retry-failed`` rewrites an output whole (``batch/durable.py``): through a temporary
made new beside it, never a name planted there, keeping the output's mode."""

from __future__ import annotations

import os
import stat

import pytest

from tests.batch.test_batch import batch, doubler, read_results, write_jsonl

__all__ = ["doubler"]  # the fixture, used by name

SUFFIX = {"jsonl": "jsonl", "csv": "csv", "parquet": "parquet"}


def _written(kind, out):
    """The files --retry-failed rewrites: the output, or each of its parts."""
    return sorted(out.glob("part-*.parquet")) if kind == "parquet" else [out]


@pytest.mark.parametrize("kind", SUFFIX)
def test_m4_retry_failed_never_writes_through_a_planted_name_and_keeps_the_mode(
    tmp_path, doubler, kind
):
    """M4: the rewrite went through the predictable ``.NAME.tmp`` (opened without
    O_EXCL/O_NOFOLLOW, so a symlink planted there had its target overwritten), and
    a 0600 output came back 0644."""
    marker = tmp_path / "mended"
    write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "n": 1}, {"id": 2, "n": 2, "flaky": str(marker)}])
    out = tmp_path / f"out.{SUFFIX[kind]}"
    args = ("--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--workers", "1")
    assert batch(doubler, *args).returncode == 1  # id 2 failed
    victim = tmp_path / "victim"
    victim.write_text("not the batch's to write")
    for path in _written(kind, out):
        path.chmod(0o600)
        path.with_name(f".{path.name}.tmp").symlink_to(victim)  # the old fixed name
    marker.touch()

    retried = batch(doubler, *args, "--retry-failed")

    assert retried.returncode == 0, retried.stderr
    assert victim.read_text() == "not the batch's to write"
    assert read_results(kind, out) == {"1": {"double": 2}, "2": {"double": 4}}
    for path in _written(kind, out):
        status = os.lstat(path)
        assert stat.S_ISREG(status.st_mode)
        # A rewritten file keeps 0600; a part written new takes the umask's mode.
        if kind != "parquet" or path.name.endswith("000000.parquet"):
            assert stat.S_IMODE(status.st_mode) == 0o600, path
    hidden = [*tmp_path.glob(".*.tmp"), *(out.glob(".*.tmp") if out.is_dir() else [])]
    assert [p for p in hidden if not p.is_symlink()] == []  # no temporary left behind


@pytest.mark.parametrize("kind", SUFFIX)
def test_an_output_whose_folder_cannot_be_made_is_one_line_naming_it(tmp_path, doubler, kind):
    write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "n": 1}])
    (tmp_path / "file").write_text("a file, where the output wants a folder")
    out = tmp_path / "file" / f"out.{SUFFIX[kind]}"
    result = batch(doubler, "--input", str(tmp_path / "in.jsonl"), "--output", str(out))
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"serving-core: error: --output {out} cannot be")
    assert "Traceback" not in result.stderr
