"""``serving-core fetch`` as the chart's init container runs it: a process of its own,
killed and run again, two at once on one cache, a 1 GiB file in little memory, and
one line on stderr when it cannot fetch, without the credentials."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from serving_core.artifacts.listing import Entry
from serving_core.artifacts.parts import PART_BYTES, Journal
from tests.artifacts.http_server import StaticServer
from tests.s3_server import MotoS3, moto_s3
from tests.servers import SERVING_CORE, base_env, free_port, wait_for

pytestmark = pytest.mark.e2e

FETCHED = re.compile(
    r"^serving-core: fetched (?P<uri>\S+) revision (?P<revision>sha256:[0-9a-f]{16}) into "
    r"(?P<path>\S+): (?P<files>\d+) files, (?P<bytes>\d+) bytes fetched$"
)


def fetch_env(uri: str, cache: Path, extra: Mapping[str, str] = ()) -> dict[str, str]:  # type: ignore[assignment]
    return base_env({"SERVING_MODEL_URI": uri, "SERVING_MODEL_CACHE": str(cache), **dict(extra)})


def start_fetch(uri: str, cache: Path, extra: Mapping[str, str] = {}) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(SERVING_CORE), "fetch"],
        env=fetch_env(uri, cache, extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_fetch(uri: str, cache: Path, extra: Mapping[str, str] = {}) -> tuple[int, str, str]:
    process = start_fetch(uri, cache, extra)
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def fetched_line(out: str) -> re.Match[str]:
    found = FETCHED.match(out.strip())
    assert found is not None, out
    return found


def write_folder(folder: Path, files: Mapping[str, bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, body in files.items():
        (folder / name).write_bytes(body)
        lines.append(f"{hashlib.sha256(body).hexdigest()}  {name}\n")
    (folder / "SHA256SUMS").write_text("".join(lines))


def journal_parts(cache: Path, name: str) -> set[int]:
    """The parts of the file ``name`` that ``cache``'s staging journal says are on disk."""
    entry = Entry(name, name, 0, None)
    return {i for folder in cache.glob("*/.staging/*/parts") for i in Journal(folder, entry).done()}


def test_a_fetch_prints_one_line_naming_what_it_fetched(moto_s3: MotoS3, tmp_path: Path) -> None:
    moto_s3.put("s3://models/cli/model.onnx", b"weights" * 100)

    code, out, err = run_fetch("s3://models/cli/", tmp_path, moto_s3.env)

    assert code == 0, err
    line = fetched_line(out)
    assert (line["uri"], line["files"], line["bytes"]) == ("s3://models/cli/", "1", "700")
    assert (Path(line["path"]) / "model.onnx").read_bytes() == b"weights" * 100


def test_an_interrupted_fetch_resumes_from_the_parts_on_disk(
    nginx_www: StaticServer, tmp_path: Path
) -> None:
    # /slow/ is rate-limited a connection: six parts, four at a time, take seconds.
    body = os.urandom(6 * PART_BYTES - 1000)
    write_folder(nginx_www.www / "slow" / "resume", {"model.bin": body})
    uri = f"{nginx_www.url}/slow/resume/"
    first = start_fetch(uri, tmp_path)
    try:
        wait_for(lambda: journal_parts(tmp_path, "model.bin"), "a part on disk", timeout_s=60)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    done = journal_parts(tmp_path, "model.bin")
    assert 0 < len(done) < 6, done
    manifest = nginx_www.www / "slow" / "resume" / "SHA256SUMS"
    manifest_left = 0 if journal_parts(tmp_path, "SHA256SUMS") else manifest.stat().st_size

    code, out, err = run_fetch(uri, tmp_path)

    assert code == 0, err
    line = fetched_line(out)
    # Exactly the parts the first run had not finished; SHA256SUMS checked the whole.
    assert int(line["bytes"]) == manifest_left + len(body) - sum(
        min(PART_BYTES, len(body) - i * PART_BYTES) for i in done
    )
    assert (Path(line["path"]) / "model.bin").read_bytes() == body
    assert not list(tmp_path.glob("*/.staging/*"))


def test_two_fetchers_of_one_cache_fetch_once_and_both_use_it(
    nginx_www: StaticServer, tmp_path: Path
) -> None:
    body = os.urandom(3 * PART_BYTES)
    write_folder(nginx_www.www / "slow" / "shared", {"model.bin": body})
    uri = f"{nginx_www.url}/slow/shared/"
    first = start_fetch(uri, tmp_path)
    # The first holds the lock once its staging folder exists; the second waits on it.
    wait_for(lambda: list(tmp_path.glob("*/.staging/*/files")), "the first fetch's staging")
    second = start_fetch(uri, tmp_path)
    outputs = [process.communicate(timeout=120) for process in (first, second)]

    assert [first.returncode, second.returncode] == [0, 0], outputs
    lines = [fetched_line(out) for out, _ in outputs]
    manifest = nginx_www.www / "slow" / "shared" / "SHA256SUMS"
    assert [int(line["bytes"]) for line in lines] == [len(body) + manifest.stat().st_size, 0]
    assert lines[0]["path"] == lines[1]["path"]
    # nginx logs a response just after its last byte: wait for the three parts' lines.
    wait_for(lambda: len(nginx_www.sent("/slow/shared/model.bin")) >= 3, "three GETs logged")
    gets = nginx_www.sent("/slow/shared/model.bin")
    assert len(gets) == 3, gets  # one GET a part, all from the first
    assert sum(get["bytes"] for get in gets) == len(body)


# Runs argv, passes its output on, then prints its peak resident set in kilobytes.
MEASURE = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
print(usage.ru_maxrss, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_one_gib_file_is_fetched_in_under_200_mb_of_memory(nginx_www: StaticServer) -> None:
    size = 1 << 30
    (nginx_www.www / "big").mkdir(exist_ok=True)
    with (nginx_www.www / "big" / "model.bin").open("wb") as sparse:
        sparse.truncate(size)  # served as zeros, takes no disk
    with tempfile.TemporaryDirectory(prefix="serving-fetch-") as cache:
        # A child's peak RSS (wait4's ru_maxrss) counts the memory of the process it was
        # forked from until its exec: a small launcher forks it, not this large pytest.
        process = subprocess.run(
            [sys.executable, "-c", MEASURE, str(SERVING_CORE), "fetch"],
            env=fetch_env(f"{nginx_www.url}/big/model.bin", Path(cache)),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

        assert process.returncode == 0, process.stderr
        fetched, peak = process.stdout.strip().splitlines()
        line = fetched_line(fetched)
        assert int(line["bytes"]) == size
        assert (Path(line["path"]) / "model.bin").stat().st_size == size
        peak_bytes = int(peak) * 1024  # Linux: kilobytes
        assert peak_bytes < 200_000_000, f"peak RSS {peak_bytes / 1e6:.0f} MB"


def test_a_denied_read_is_one_line_exit_1_and_no_secret(tmp_path: Path) -> None:
    with moto_s3(auth=True) as guarded:  # it issued no key: every request is denied
        code, out, err = run_fetch("s3://models/weights/", tmp_path, guarded.env)

    assert code == 1
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("serving-core: error: SERVING_MODEL_URI=s3://models/weights/: access")
    assert "AWS_ACCESS_KEY_ID" in err
    assert guarded.secret_access_key not in out + err


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("s3://models/absent/", "missing: the folder holds no objects"),
        ("s3://no-such-bucket-here/model/", "missing: no object or bucket"),
        ("s3://models/absent.onnx", "missing: the folder holds no objects"),
        ("http:/private/model.bin", "access denied reading 'model.bin' (HTTP 403)"),
        ("http:/nowhere/model.bin", "missing: no object or bucket at 'model.bin'"),
        ("unreachable", "unreachable: no answer from the store"),
    ],
)
def test_a_missing_or_unreadable_model_is_one_line_and_exit_1(
    moto_s3: MotoS3, nginx_www: StaticServer, tmp_path: Path, where: str, said: str
) -> None:
    moto_s3.put("s3://models/present/model.onnx", b"here")
    env = dict(moto_s3.env)
    uri = where
    if where.startswith("http:"):
        # A presigned URL's signature is a secret too.
        uri = f"{nginx_www.url}{where[len('http:') :]}?X-Amz-Signature=presigned-secret"
    if where == "unreachable":
        uri = "s3://models/present/"
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"

    code, out, err = run_fetch(uri, tmp_path, env)

    assert code == 1, out
    assert out == ""
    assert err.count("\n") == 1, err
    assert said in err
    assert "X-Amz-Signature=***" in err or "X-Amz" not in uri
    for secret in (moto_s3.secret_access_key, "presigned-secret"):
        assert secret not in err


def test_without_a_uri_fetch_says_what_to_set(tmp_path: Path) -> None:
    code, _, err = run_fetch("", tmp_path)

    assert code == 2
    assert "SERVING_MODEL_URI is empty" in err
