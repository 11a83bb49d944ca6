"""``fetch_model`` against moto's S3 and nginx: what it fetches, verifies, caches and
refuses, in this process (the command's own tests run ``serving-core fetch``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from serving_core.artifacts.fetcher import FetchError, fetch_model
from tests.artifacts.http_server import StaticServer
from tests.s3_server import MotoS3

pytestmark = pytest.mark.e2e

FILES = {
    "config.json": b'{"dim": 384}',
    "model.safetensors": os.urandom(3 * 1024 * 1024 + 17),
    "tokenizer/vocab.txt": b"[PAD]\n[UNK]\nhello\n",
    "tokenizer/deep/merges.txt": b"h e\n",
}


def write_model(folder: Path, files: dict[str, bytes], *, manifest: bool = False) -> Path:
    for name, body in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(body)
    if manifest:
        lines = [f"{hashlib.sha256(body).hexdigest()}  {name}\n" for name, body in files.items()]
        (folder / "SHA256SUMS").write_text("".join(lines))
    return folder


def read_tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture
def aws(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    """obstore reads the store's credentials and endpoint from the environment."""
    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    return moto_s3


@pytest.mark.parametrize("manifest", [False, True], ids=["etag-md5", "manifest"])
def test_an_s3_prefix_with_nested_files_is_fetched_whole_in_small_parts(
    aws: MotoS3, tmp_path: Path, manifest: bool
) -> None:
    uri = f"s3://models/nested-{manifest}/"
    aws.upload(write_model(tmp_path / "src", FILES, manifest=manifest), uri)

    fetched = fetch_model(uri, tmp_path / "cache", part_bytes=1024 * 1024)

    expected = read_tree(tmp_path / "src")
    assert read_tree(fetched.path) == expected
    assert fetched.fetched_bytes == sum(len(body) for body in expected.values())
    assert fetched.revision.startswith("sha256:")
    assert len(fetched.revision) == len("sha256:") + 16
    assert fetched.files == len(expected)
    assert fetched.path.is_relative_to(tmp_path / "cache")


def test_a_second_fetch_of_an_unchanged_listing_fetches_nothing(
    aws: MotoS3, tmp_path: Path
) -> None:
    uri = "s3://models/cached/"
    aws.upload(write_model(tmp_path / "src", FILES), uri)
    first = fetch_model(uri, tmp_path / "cache")

    again = fetch_model(uri, tmp_path / "cache")

    assert again.fetched_bytes == 0
    assert (again.path, again.revision) == (first.path, first.revision)


def test_a_changed_object_is_a_new_revision_fetched_again(aws: MotoS3, tmp_path: Path) -> None:
    uri = "s3://models/changed/"
    aws.upload(write_model(tmp_path / "src", FILES), uri)
    first = fetch_model(uri, tmp_path / "cache")
    aws.put(uri + "config.json", b'{"dim": 768}')

    second = fetch_model(uri, tmp_path / "cache")

    assert second.revision != first.revision
    assert (second.path / "config.json").read_bytes() == b'{"dim": 768}'
    # A new revision is fetched whole into its own folder, the old one left as it was.
    assert second.fetched_bytes == sum(len(b) for b in FILES.values())
    # The revision being served stays whole for whoever still reads it.
    assert (first.path / "config.json").read_bytes() == b'{"dim": 384}'


def test_a_single_object_uri_is_a_directory_holding_that_file(aws: MotoS3, tmp_path: Path) -> None:
    aws.put("s3://models/single/model.onnx", b"onnx" * 1000)
    aws.put("s3://models/single/other.bin", b"not this one")

    fetched = fetch_model("s3://models/single/model.onnx", tmp_path / "cache")

    assert read_tree(fetched.path) == {"model.onnx": b"onnx" * 1000}


def test_a_prefix_named_without_its_slash_is_fetched_as_a_folder(
    aws: MotoS3, tmp_path: Path
) -> None:
    aws.upload(write_model(tmp_path / "src", FILES), "s3://models/noslash/")

    fetched = fetch_model("s3://models/noslash", tmp_path / "cache")

    assert read_tree(fetched.path) == FILES


def test_a_bad_checksum_is_refused_and_nothing_is_left_in_place(
    aws: MotoS3, tmp_path: Path
) -> None:
    uri = "s3://models/corrupt/"
    source = write_model(tmp_path / "src", FILES, manifest=True)
    (source / "tokenizer/vocab.txt").write_bytes(b"[PAD]\n[UNK]\nhellp\n")  # after the manifest
    aws.upload(source, uri)
    cache = tmp_path / "cache"

    with pytest.raises(FetchError, match=r"bad checksum: 'tokenizer/vocab.txt'") as caught:
        fetch_model(uri, cache)

    assert str(caught.value).startswith(f"SERVING_MODEL_URI={uri}: ")
    assert "\n" not in str(caught.value)
    (root,) = cache.iterdir()
    # Only the lock and an empty staging area: no revision, no pointer to one, no file.
    left = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    assert left == [".lock", ".staging"], left


def test_a_manifest_that_does_not_name_a_file_is_refused(aws: MotoS3, tmp_path: Path) -> None:
    source = write_model(tmp_path / "src", FILES, manifest=True)
    (source / "extra.bin").write_bytes(b"unlisted")
    aws.upload(source, "s3://models/unnamed/")

    with pytest.raises(FetchError, match=r"SHA256SUMS does not name 'extra.bin'"):
        fetch_model("s3://models/unnamed/", tmp_path / "cache")


def test_offline_serves_the_cached_revision_without_asking_the_store(
    aws: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = "s3://models/offline/"
    aws.upload(write_model(tmp_path / "src", FILES), uri)
    fetched = fetch_model(uri, tmp_path / "cache")
    # Nothing listens there: a request to the store would fail.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")

    offline = fetch_model(uri, tmp_path / "cache", offline=True)

    assert (offline.path, offline.revision, offline.fetched_bytes) == (
        fetched.path,
        fetched.revision,
        0,
    )


def test_an_http_folder_is_fetched_from_its_manifest(
    nginx_www: StaticServer, tmp_path: Path
) -> None:
    write_model(nginx_www.www / "folder", FILES, manifest=True)

    fetched = fetch_model(f"{nginx_www.url}/folder/", tmp_path / "cache", part_bytes=1 << 20)

    assert read_tree(fetched.path) == read_tree(nginx_www.www / "folder")


def test_an_http_folder_without_a_manifest_is_refused_naming_it(
    nginx_www: StaticServer, tmp_path: Path
) -> None:
    write_model(nginx_www.www / "bare", FILES)

    with pytest.raises(FetchError, match=r"cannot be listed and has no SHA256SUMS"):
        fetch_model(f"{nginx_www.url}/bare/", tmp_path / "cache")


def test_a_signed_url_is_fetched_with_its_query_and_cached_under_its_masked_form(
    nginx_www: StaticServer, tmp_path: Path
) -> None:
    (nginx_www.www / "signed").mkdir()
    (nginx_www.www / "signed" / "model.onnx").write_bytes(FILES["model.safetensors"])
    url = f"{nginx_www.url}/signed/model.onnx?X-Amz-Signature="

    fetched = fetch_model(url + "first", tmp_path / "cache", part_bytes=1 << 20)
    again = fetch_model(url + "second", tmp_path / "cache")

    assert read_tree(fetched.path) == {"model.onnx": FILES["model.safetensors"]}
    assert again.fetched_bytes == 0
    # Every request carried the signature: a signed URL is signed with its query.
    gets = [e for e in nginx_www.entries() if e["path"] == "/signed/model.onnx"]
    assert {e["method"] for e in gets} == {"GET"}, gets
    assert all(e["query"].startswith("X-Amz-Signature=") for e in gets), gets
    assert not any("first" in p.name for p in (tmp_path / "cache").rglob("*"))
