"""`make serve` on a clean machine, as a user who is not root and has no sudo: it
makes the venv, installs the framework and the default handler's requirements,
and serves the default handler's sample (issue 43's done-when line).

The machine is a container (tests/container/workstation.Containerfile): Debian
bookworm with python3, python3-venv and make installed at image level, as a
user's machine has them, the repository's files copied in, and no sudo. It runs
on the host network, with this machine's pip settings (proxy CA, local wheel
folders and indexes) lent read-only as the image builds get them
(tests/container/pipmounts.py), so pip reaches what it reaches here.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.container import bases
from tests.container.engine import Engine, EngineError
from tests.container.images import REPORT, build_timed, handler_dir, sample, torch_index_args
from tests.container.pipmounts import pip_mounts
from tests.servers import ROOT, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.container, pytest.mark.timeout(3600)]

CONTAINERFILE = Path(__file__).resolve().parent / "workstation.Containerfile"
DEBIAN = "docker.io/library/debian:bookworm"
# A bound on the whole install (torch included) and the model's load on a loaded
# machine, never an expected time.
SERVE_TIMEOUT_S = 2400.0
TORCH_INDEX = "https://download.pytorch.org/whl/cpu/"


def make_env() -> dict[str, str]:
    """TORCH_INDEX_URL as `make test` exports it; unset, .ci/run's rule: empty where
    PyTorch's index does not answer (pip would retry it for every requirement). Until
    the Makefile probes that host itself (issue 43), a user without it must say
    TORCH_INDEX_URL= too."""
    given = torch_index_args()
    if given:
        return given
    try:
        urllib.request.urlopen(TORCH_INDEX, timeout=10).close()
    except OSError:
        return {"TORCH_INDEX_URL": ""}
    return {}


def debian(engine: Engine) -> str:
    """debian:bookworm when the engine has it or can pull it, else the stand-in."""
    if engine.image_exists(DEBIAN) or not engine.pull(DEBIAN, bases.PULL_TIMEOUT_S):
        return DEBIAN
    return bases.debian_image(engine)


def clone(into: Path) -> Path:
    """The repository's files as a clone has them (this checkout's, edits included)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
            target.chmod(source.stat().st_mode & 0o777)
    return into


@pytest.fixture(scope="module")
def workstation(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> str:
    context = tmp_path_factory.mktemp("workstation")
    clone(context / "serving-core")
    tag = "serving-core-test:workstation"
    build_timed(
        engine,
        "workstation image (bookworm, python3-venv, make, a user)",
        context,
        tag,
        containerfile=CONTAINERFILE,
        build_args={"DEBIAN_IMAGE": debian(engine)},
    )
    return tag


@contextlib.contextmanager
def make_serve(engine: Engine, image: str, env: dict[str, str], tmp: Path) -> Iterator[str]:
    """``make serve`` run by the image's user, on the host network, with ``env``."""
    name = f"serving-make-serve-{uuid.uuid4().hex[:8]}"
    args = ["run", "--detach", "--name", name, "--network", "host"]
    for source, target in pip_mounts(tmp):
        args += ["--volume", f"{source}:{target}:ro"]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    engine.call(*args, image, "make", "serve")
    try:
        yield name
    finally:
        rm = ["rm", "--force"] + (["-t", "0"] if engine.podman else [])
        engine.call(*rm, name, check=False)


def wait_ready(engine: Engine, container: str, url: str) -> None:
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while True:
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=5).status_code == 200:
                return
        if not engine.running(container):
            raise EngineError(
                f"`make serve` exited before {url} answered:\n{engine.logs(container)}"
            )
        if time.monotonic() > deadline:
            raise EngineError(f"{url} did not answer in {SERVE_TIMEOUT_S:g} s")
        time.sleep(2)


def test_make_serve_as_a_user_without_sudo_installs_and_serves_the_default_handler(
    engine: Engine, workstation: str, expected_answer: Any, tmp_path: Path
) -> None:
    user = engine.call("run", "--rm", workstation, "sh", "-c", "id -u; command -v sudo || true")
    uid, *sudo = user.stdout.split()
    assert uid != "0", "the machine's user must not be root"
    assert not sudo, f"the machine must have no sudo, found {sudo}"
    bind = f"127.0.0.1:{free_port()}"
    env = {**make_env(), "SERVING_BIND": bind}
    started = time.monotonic()
    with make_serve(engine, workstation, env, tmp_path) as container:
        wait_ready(engine, container, f"http://{bind}/readyz")
        index = env.get("TORCH_INDEX_URL", "the Makefile's default")
        REPORT.append(
            f"make serve (TORCH_INDEX_URL: {index or 'empty'}): "
            f"served in {time.monotonic() - started:.0f} s"
        )
        answer = requests.post(f"http://{bind}/predict", json=sample(), timeout=60)
        output = engine.logs(container)
    assert answer.status_code == 200, answer.text
    assert approximately(answer.json(), expected_answer), (answer.json(), expected_answer)
    assert f"{handler_dir()}/requirements.txt" in output, output[-6000:]
    for word in ("apt-get", "sudo", "dpkg"):
        assert word not in output, f"make serve ran {word}:\n{output[-6000:]}"


def approximately(got: Any, wanted: Any) -> bool:
    """Equal, floats to 1e-4 (one torch build, another process)."""
    if isinstance(wanted, float):
        return isinstance(got, (int, float)) and abs(got - wanted) < 1e-4
    if isinstance(wanted, dict):
        return (
            isinstance(got, dict)
            and got.keys() == wanted.keys()
            and all(approximately(got[k], v) for k, v in wanted.items())
        )
    if isinstance(wanted, list):
        return (
            isinstance(got, list)
            and len(got) == len(wanted)
            and all(approximately(g, w) for g, w in zip(got, wanted, strict=True))
        )
    return bool(got == wanted)
