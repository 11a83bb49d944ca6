"""The container tests' engine, base images, images and stack.

The images come from SERVING_TEST_IMAGE / SERVING_TEST_NGINX_IMAGE where CI
built them already; otherwise they are built here (the app image for the
handler image.yml names, or SERVING_TEST_HANDLER_DIR), each layer cached in the
engine's store for the next run. Without an engine every test here fails,
saying how to install one. The end of the run says which engine, which base
images and which images were used, and how long each build took.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.container import bases
from tests.container.engine import Engine, EngineError, Hardening, Healthcheck, Network
from tests.servers import ROOT

HEALTHY_TIMEOUT_S = 300.0
NGINX_HEALTHY_TIMEOUT_S = 60.0
APP_PORT = 8000
NGINX_PORT = 8080
NGINX_METRICS_PORT = 9090
# No Redis runs in these tests: without SERVING_JOBS_URL the app keeps its job
# queue in SQLite under /tmp, which the compose file's worker would not see.
APP_ENV_LEFT_OUT = {"SERVING_JOBS_URL"}

REPORT: list[str] = []  # the run's engine, bases, images and build times
ENGINES: list[Engine] = []  # the engine found, for the disk use at the end


def image_workflow_env() -> dict[str, str]:
    """The env of .github/workflows/image.yml: HANDLER_DIR and SHARED_DIRS of the images."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "image.yml").read_text())
    return {k: str(v) for k, v in workflow["env"].items()}


def handler_dir() -> str:
    """The handler the app image serves: image.yml's HANDLER_DIR (SERVING_TEST_HANDLER_DIR wins)."""
    return os.environ.get("SERVING_TEST_HANDLER_DIR") or image_workflow_env()["HANDLER_DIR"]


def sample() -> dict[str, Any]:
    path = ROOT / handler_dir() / "sample.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: the container tests post the handler's sample.json")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def compose_services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return services


def seconds(duration: str) -> int:
    """A compose duration ("40s", "2m") in whole seconds."""
    value, unit = re.fullmatch(r"(\d+)(s|m)", duration).groups()  # type: ignore[union-attr]
    return int(value) * (60 if unit == "m" else 1)


def hardening(spec: Mapping[str, Any]) -> Hardening:
    return Hardening(
        read_only=spec["read_only"],
        tmpfs=tuple(spec["tmpfs"]),
        cap_drop=tuple(spec["cap_drop"]),
        security_opt=tuple(spec["security_opt"]),
    )


def environment(spec: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in spec["environment"].items() if k not in APP_ENV_LEFT_OUT}


def build_timed(engine: Engine, what: str, context: Path, tag: str, **kwargs: Any) -> None:
    started = time.monotonic()
    engine.build(context, tag, **kwargs)
    REPORT.append(f"{what}: built {tag} in {time.monotonic() - started:.0f} s")


def torch_index_args() -> dict[str, str]:
    """TORCH_INDEX_URL as `make test` exports it (empty: PyPI alone); unset: the Dockerfile's."""
    value = os.environ.get("TORCH_INDEX_URL")
    return {} if value is None else {"TORCH_INDEX_URL": value}


@pytest.fixture(scope="session")
def engine() -> Engine:
    try:
        found = Engine.find()
    except EngineError as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    REPORT.append(f"container engine: {found.why}")
    ENGINES.append(found)
    return found


def _resolved(engine: Engine, base: bases.Base) -> bases.Resolved:
    started = time.monotonic()
    try:
        resolved = bases.resolve(engine, base)
    except EngineError as exc:
        failed = str(exc)
    else:
        failed = ""
    if failed:
        pytest.fail(failed, pytrace=False)
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
    args = {
        **base.build_args(),
        "HANDLER_DIR": handler_dir(),
        "SHARED_DIRS": image_workflow_env().get("SHARED_DIRS", ""),
        **torch_index_args(),
    }
    build_timed(engine, f"app image ({handler_dir()})", ROOT, tag, build_args=args)
    return tag


@pytest.fixture(scope="session")
def nginx_image(engine: Engine) -> str:
    given = os.environ.get("SERVING_TEST_NGINX_IMAGE")
    if given:
        REPORT.append(f"nginx image: {given} (SERVING_TEST_NGINX_IMAGE)")
        return given
    base = _resolved(engine, bases.NGINX)
    tag = "serving-core-test:nginx"
    build_timed(engine, "nginx image", ROOT / "nginx", tag, build_args=base.build_args())
    return tag


@pytest.fixture(scope="session")
def expected_answer() -> Any:
    """What `serving-core check` prints for the handler here, outside any image."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "serving-core"), "check", handler_dir()],
        cwd=ROOT,
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


@dataclass(frozen=True)
class Stack:
    engine: Engine
    app: str
    nginx: str
    url: str  # nginx's API port
    metrics_url: str  # nginx's metrics port


@contextlib.contextmanager
def compose_stack(
    engine: Engine,
    app_image: str,
    nginx_image: str,
    app_overrides: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """The app and nginx as docker-compose.yml runs them: the app on an internal
    network as "app", nginx on it and on a second network with its port
    published (and its metrics port, which Prometheus would scrape inside),
    each with the file's environment (the app's with ``app_overrides``), health
    check and hardening."""
    services = compose_services()
    app_spec, nginx_spec = services["app"], services["nginx"]
    check = app_spec["healthcheck"]
    run = f"serving-test-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as cleanup:
        backend = cleanup.enter_context(engine.network(f"{run}-backend", internal=True))
        frontend = cleanup.enter_context(engine.network(f"{run}-frontend"))
        app = cleanup.enter_context(
            engine.container(
                app_image,
                f"{run}-app",
                env={**environment(app_spec), **(app_overrides or {})},
                networks=[Network(backend, aliases=("app",))],
                hardening=hardening(app_spec),
                healthcheck=Healthcheck(
                    test=check["test"],
                    interval=check["interval"],
                    timeout=check["timeout"],
                    start_period=check["start_period"],
                    retries=check["retries"],
                ),
                stop_timeout_s=seconds(app_spec["stop_grace_period"]),
            )
        )
        engine.wait_healthy(app, HEALTHY_TIMEOUT_S)
        nginx = cleanup.enter_context(
            engine.container(
                nginx_image,
                f"{run}-nginx",
                env=environment(nginx_spec),
                networks=[Network(frontend), Network(backend)],
                publish=[NGINX_PORT, NGINX_METRICS_PORT],
                hardening=hardening(nginx_spec),
                stop_timeout_s=seconds(nginx_spec["stop_grace_period"]),
            )
        )
        engine.wait_healthy(nginx, NGINX_HEALTHY_TIMEOUT_S)
        yield Stack(
            engine,
            app,
            nginx,
            f"http://127.0.0.1:{engine.port(nginx, NGINX_PORT)}",
            f"http://127.0.0.1:{engine.port(nginx, NGINX_METRICS_PORT)}",
        )


@pytest.fixture(scope="module")
def stack(engine: Engine, app_image: str, nginx_image: str) -> Iterator[Stack]:
    started = time.monotonic()
    with compose_stack(engine, app_image, nginx_image) as running:
        REPORT.append(f"stack healthy in {time.monotonic() - started:.0f} s")
        yield running


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test against a stack shows both containers' logs."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    running = getattr(item, "funcargs", {}).get("stack")
    if report.failed and isinstance(running, Stack):
        for name in (running.app, running.nginx):
            with contextlib.suppress(EngineError, subprocess.TimeoutExpired):
                report.sections.append((f"log of {name}", running.engine.logs(name)[-20000:]))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("container images")
        for line in REPORT:
            terminalreporter.write_line(line)
    for engine in ENGINES:
        with contextlib.suppress(EngineError, subprocess.TimeoutExpired):
            terminalreporter.write_line(f"{engine.cli} system df:\n{engine.disk_usage()}")
