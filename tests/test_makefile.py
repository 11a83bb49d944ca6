"""What the Makefile decides before a recipe runs: PyTorch's index, probed once per
make run and left out when it does not answer (an explicit TORCH_INDEX_URL wins
and probes nothing), the container engine `make image` builds with, and which
suite each of `make check` and `make test` is."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import ROOT

MAKE = shutil.which("make") or "make"
# Two recipes that each see the exported TORCH_INDEX_URL: one probe serves both.
SHOW = ["--eval", "a: ; @echo a=$$TORCH_INDEX_URL", "--eval", "b: a ; @echo b=$$TORCH_INDEX_URL"]


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("TORCH_INDEX_URL", "MAKEFLAGS")}
    return subprocess.run(
        [MAKE, "--no-print-directory", "-f", str(ROOT / "Makefile"), *args],
        cwd=ROOT,
        env=env if env is not None else base,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


class Index(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def index() -> Iterator[str]:
    Index.hits = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu/"
    finally:
        server.shutdown()
        server.server_close()


def test_an_index_that_answers_is_used_and_probed_once(index: str) -> None:
    done = make(*SHOW, "b", f"TORCH_INDEX={index}")
    assert done.returncode == 0, done.stderr
    assert re.findall(r"(?m)^[ab]=(.*)$", done.stdout) == [index, index]
    assert Index.hits == 1


def test_an_index_that_does_not_answer_is_left_out_and_said_so(index: str) -> None:
    closed = index.replace("127.0.0.1", "127.0.0.2")  # nothing listens there
    done = make(*SHOW, "b", f"TORCH_INDEX={closed}")
    assert done.returncode == 0, done.stderr
    assert re.findall(r"(?m)^[ab]=(.*)$", done.stdout) == ["", ""]
    assert f"{closed} does not answer; installing with TORCH_INDEX_URL=" in done.stdout


@pytest.mark.parametrize("given", ["https://mirror.example.com/whl/cpu", ""])
@pytest.mark.parametrize("how", ["command line", "environment"])
def test_an_explicit_torch_index_url_wins_and_probes_nothing(
    index: str, given: str, how: str
) -> None:
    if how == "command line":
        done = make(*SHOW, "b", f"TORCH_INDEX={index}", f"TORCH_INDEX_URL={given}")
    else:
        env = {**os.environ, "TORCH_INDEX": index, "TORCH_INDEX_URL": given}
        done = make(*SHOW, "b", env=env)
    assert done.returncode == 0, done.stderr
    assert re.findall(r"(?m)^[ab]=(.*)$", done.stdout) == [given, given]
    assert Index.hits == 0


def docker_answers() -> bool:
    docker = shutil.which("docker")
    return (
        docker is not None
        and subprocess.run(
            [docker, "info"], capture_output=True, check=False, timeout=60
        ).returncode
        == 0
    )


def test_make_image_builds_with_docker_when_its_daemon_answers_else_podman() -> None:
    done = make("-n", "image", "TORCH_INDEX_URL=")
    assert done.returncode == 0, done.stderr
    engine = "docker" if docker_answers() else "podman"
    assert done.stdout.startswith(f"{engine} build "), done.stdout
    # The framework's version goes to its own label, not the image's version.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"--build-arg FRAMEWORK_VERSION={version} " in done.stdout, done.stdout
    assert "--build-arg VERSION=" not in done.stdout, done.stdout


def test_make_image_builds_with_podman_where_there_is_no_docker(tmp_path: Path) -> None:
    # A PATH with what make needs and no docker at all.
    for tool in ("sed", "bash", "sh"):
        found = shutil.which(tool)
        assert found
        (tmp_path / tool).symlink_to(found)
    done = make("-n", "image", "TORCH_INDEX_URL=", env={"PATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("podman build "), done.stdout


def prerequisites(target: str) -> list[str]:
    (line,) = re.findall(rf"(?m)^{target}:(.*)$", (ROOT / "Makefile").read_text())
    return line.split()


def test_make_check_is_the_users_suite_and_make_test_the_frameworks() -> None:
    assert prerequisites("check") == ["lint-handlers", "typecheck-handlers", "contracts"]
    assert "contracts" in prerequisites("test")
    assert "system-deps" not in prerequisites("check")
    done = make("-n", "check", "TORCH_INDEX_URL=", "BIN=/nonexistent")
    assert done.returncode == 0, done.stderr
    assert "ruff check handlers" in done.stdout
    assert "tests/container/test_stack.py::" in done.stdout
    assert "tests/deploy/test_chart_user_values.py" in done.stdout
    assert "apt-get" not in done.stdout
