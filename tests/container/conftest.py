"""The container tests' engine, base images, images and stack.

The images come from SERVING_TEST_IMAGE / SERVING_TEST_NGINX_IMAGE where CI
built them already; otherwise they are built here (tests/container/images.py
says with what), each layer cached in the engine's store for the next run.
Without an engine every test here fails, saying how to install one. The end of
the run says which engine, base images and images were used, how long each
build took, and the engine's disk use.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.container import bases
from tests.container.engine import Engine, EngineError
from tests.container.images import REPORT, app_build_args, build_timed, handler_dir
from tests.container.stack import Stack, compose_stack
from tests.servers import ROOT, base_env

T = TypeVar("T")
ENGINES: list[Engine] = []  # the engine found, for the disk use at the end


def _or_fail(call: Callable[[], T]) -> T:
    """``call()``; an EngineError fails the test with its message alone (it says what to do)."""
    try:
        return call()
    except EngineError as exc:
        message = str(exc)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def engine() -> Engine:
    found = _or_fail(Engine.find)
    REPORT.append(f"container engine: {found.why}")
    ENGINES.append(found)
    return found


def _resolved(engine: Engine, base: bases.Base) -> bases.Resolved:
    started = time.monotonic()
    resolved = _or_fail(lambda: bases.resolve(engine, base))
    REPORT.append(f"base {resolved.describe()}, ready in {time.monotonic() - started:.0f} s")
    return resolved


@pytest.fixture(scope="session")
def python_base(engine: Engine) -> bases.Resolved:
    return _resolved(engine, bases.PYTHON)


@pytest.fixture(scope="session")
def app_image(engine: Engine, request: pytest.FixtureRequest) -> str:
    given = os.environ.get("SERVING_TEST_IMAGE")
    if given:
        REPORT.append(f"app image: {given} (SERVING_TEST_IMAGE)")
        return given
    base: bases.Resolved = request.getfixturevalue("python_base")
    tag = f"serving-core-test:app-{Path(handler_dir()).name}"
    build_timed(
        engine,
        f"app image ({handler_dir()})",
        ROOT,
        tag,
        build_args=app_build_args(),
        build_contexts=base.build_contexts(),
    )
    return tag


@pytest.fixture(scope="session")
def nginx_image(engine: Engine) -> str:
    given = os.environ.get("SERVING_TEST_NGINX_IMAGE")
    if given:
        REPORT.append(f"nginx image: {given} (SERVING_TEST_NGINX_IMAGE)")
        return given
    base = _resolved(engine, bases.NGINX)
    tag = "serving-core-test:nginx"
    build_timed(engine, "nginx image", ROOT / "nginx", tag, build_contexts=base.build_contexts())
    return tag


@pytest.fixture(scope="session")
def expected_answer() -> Any:
    """What `serving-core check` prints for the handler here, outside any image."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "serving-core"), "check", handler_dir()],
        cwd=ROOT,
        # No SERVING_* of this process (SERVING_TEST_IMAGE...): serving-core refuses
        # names it does not know.
        env=base_env({}),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        pytest.fail(
            f"`serving-core check {handler_dir()}` failed here, so there is no answer to "
            f"compare the image's with (`make install-handlers` installs its "
            f"requirements):\n{result.stderr[-4000:]}",
            pytrace=False,
        )
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def stack(engine: Engine, app_image: str, nginx_image: str) -> Iterator[Stack]:
    started = time.monotonic()
    with compose_stack(engine, app_image, nginx_image) as running:
        REPORT.append(f"stack healthy in {time.monotonic() - started:.0f} s")
        yield running


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that ran against a stack shows both containers' logs."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    funcargs = getattr(item, "funcargs", {})
    for running in funcargs.values():
        if report.failed and isinstance(running, Stack):
            for name in (running.app, running.nginx):
                with contextlib.suppress(EngineError, subprocess.TimeoutExpired):
                    log = running.engine.logs(name)[-20000:]
                    report.sections.append((f"log of {name}", log))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("container images")
        for line in REPORT:
            terminalreporter.write_line(line)
    for engine in ENGINES:
        with contextlib.suppress(EngineError, subprocess.TimeoutExpired):
            terminalreporter.write_line(f"{engine.cli} system df:\n{engine.disk_usage()}")
