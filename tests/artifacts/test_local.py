"""What the fetcher decides without a store: a local folder used in place, offline with
nothing cached, the manifest's format, and what a failure's line shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving_core.artifacts.failures import FetchError, from_store
from serving_core.artifacts.fetcher import fetch_model
from serving_core.artifacts.manifest import ManifestError, parse_manifest

DIGEST = "ab" * 32


def test_a_local_folder_is_used_in_place_with_a_revision_of_its_listing(tmp_path: Path) -> None:
    folder = tmp_path / "baked"
    (folder / "tokenizer").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer" / "vocab.txt").write_text("hello\n")

    for uri in (str(folder), f"file://{folder}"):
        fetched = fetch_model(uri, tmp_path / "cache")
        assert (fetched.path, fetched.fetched_bytes, fetched.files) == (folder, 0, 2)
    (folder / "config.json").write_text('{"dim": 768}')
    assert fetch_model(str(folder), tmp_path / "cache").revision != fetched.revision
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("absent", "missing: no such folder"),
        ("model.onnx", "not a file"),
        ("ftp://host/model/", "no store reads ftp://: use abfs://"),
    ],
)
def test_a_local_uri_that_is_no_folder_is_refused(tmp_path: Path, name: str, said: str) -> None:
    (tmp_path / "model.onnx").write_text("a file, not its folder")

    with pytest.raises(FetchError, match=said):
        fetch_model(name if "://" in name else str(tmp_path / name), tmp_path / "cache")


def test_offline_without_a_cached_copy_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"offline \(SERVING_MODEL_OFFLINE\) and no fetched"):
        fetch_model("s3://models/never-fetched/", tmp_path / "cache", offline=True)


def test_a_manifest_is_read_as_sha256sum_writes_it() -> None:
    text = f"{DIGEST}  config.json\n{DIGEST.upper()} *./tokenizer/vocab.txt\n\n"

    assert parse_manifest(text) == {"config.json": DIGEST, "tokenizer/vocab.txt": DIGEST}


@pytest.mark.parametrize(
    ("line", "said"),
    [("not a digest  file", "line 1 is not"), (f"{DIGEST}  ../etc/passwd", "not inside")],
)
def test_a_manifest_line_sha256sum_would_not_write_is_refused(line: str, said: str) -> None:
    with pytest.raises(ManifestError, match=said):
        parse_manifest(line + "\n")


def test_a_store_error_is_shown_without_its_text_nor_the_uri_secrets() -> None:
    store_text = "Server returned non-2xx status code: 403 Forbidden: X-Amz-Signature=abc"
    uri = "https://b.s3.amazonaws.com/m.onnx?X-Amz-Signature=abc&X-Amz-Credential=key"

    error = from_store(RuntimeError(store_text), uri, "m.onnx", "AWS_ACCESS_KEY_ID")

    assert str(error) == (
        "SERVING_MODEL_URI=https://b.s3.amazonaws.com/m.onnx?X-Amz-Signature=***"
        "&X-Amz-Credential=***: access denied reading 'm.onnx' (HTTP 403); give the "
        "credentials read and list access, or set them (AWS_ACCESS_KEY_ID; see "
        "docs/artifacts.md#the-stores)"
    )
