"""A handler's system-packages.txt, built for real: the Debian packages it names
are in the image, so a handler that loads a system library serves; without the
file the build's own `serving-core check` fails.

The handler loads the OpenMP runtime (libgomp1, what LightGBM and scikit-learn's
wheels link against), which the slim Python base lacks. It is built from a
build context of its own: the repository's context files (the allow-list in
.dockerignore) with only this handler under handlers/.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.container import bases
from tests.container.context import app_context
from tests.container.engine import Engine, EngineError, Hardening
from tests.container.images import build_timed, torch_index_args

pytestmark = [pytest.mark.e2e, pytest.mark.container, pytest.mark.timeout(1800)]

HANDLER_DIR = "handlers/openmp"
HANDLER = '''"""Loads the OpenMP runtime, as LightGBM does: libgomp1 must be in the image."""

import ctypes
from typing import Any

from serving_core import Handler


class OpenMP(Handler):
    def setup(self) -> None:
        self.gomp = ctypes.CDLL("libgomp.so.1")

    def predict(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"openmp_threads": int(self.gomp.omp_get_max_threads()), "echo": params}
'''
SYSTEM_PACKAGES = "# The OpenMP runtime LightGBM loads.\nlibgomp1  # GNU OpenMP\n"
SAMPLE = '{"text": "hello"}\n'
HEALTHY_TIMEOUT_S = 300.0


def build_context(tmp: Path, *, system_packages: bool) -> Path:
    """The app's build context: the files .dockerignore lets in, handlers/ holding only ours."""
    files = {f"{HANDLER_DIR}/handler.py": HANDLER, f"{HANDLER_DIR}/sample.json": SAMPLE}
    if system_packages:
        files[f"{HANDLER_DIR}/system-packages.txt"] = SYSTEM_PACKAGES
    return app_context(tmp, files)


def build(engine: Engine, base: bases.Resolved, context: Path, tag: str) -> None:
    """The app image of ``context`` on the resolved base, as image.yml builds it."""
    build_timed(
        engine,
        f"app image ({HANDLER_DIR})",
        context,
        tag,
        build_args={"HANDLER_DIR": HANDLER_DIR, **torch_index_args()},
        build_contexts=base.build_contexts(),
    )


@pytest.fixture(scope="module")
def openmp_image(
    engine: Engine, python_base: bases.Resolved, tmp_path_factory: pytest.TempPathFactory
) -> str:
    context = build_context(tmp_path_factory.mktemp("openmp"), system_packages=True)
    tag = "serving-core-test:app-openmp"
    build(engine, python_base, context, tag)
    return tag


@pytest.fixture
def openmp_container(engine: Engine, openmp_image: str) -> Iterator[tuple[str, str]]:
    with engine.container(
        openmp_image,
        f"serving-test-openmp-{uuid.uuid4().hex[:8]}",
        env={"SERVING_BIND": "0.0.0.0:8000"},
        publish=[8000],
        hardening=Hardening(),
    ) as container:
        # The image's own HEALTHCHECK (serving-core healthcheck), run by the engine.
        engine.wait_healthy(container, HEALTHY_TIMEOUT_S)
        yield container, f"http://127.0.0.1:{engine.port(container, 8000)}"


def test_the_base_image_lacks_the_library_the_handler_needs(
    engine: Engine, python_base: bases.Resolved
) -> None:
    # Otherwise the tests below would pass without the system package.
    result = engine.call(
        "run",
        "--rm",
        python_base.image,
        "sh",
        "-c",
        "ldconfig -p | grep -c libgomp.so.1",
        check=False,
    )
    assert result.stdout.strip() == "0", result.stdout + result.stderr


def test_a_handler_that_names_its_system_package_serves_its_sample(
    openmp_container: tuple[str, str],
) -> None:
    _, url = openmp_container
    response = requests.post(
        url + "/predict", data=SAMPLE, timeout=60, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["openmp_threads"] >= 1


def test_without_its_system_packages_the_builds_check_fails(
    engine: Engine, python_base: bases.Resolved, tmp_path: Path
) -> None:
    context = build_context(tmp_path, system_packages=False)
    with pytest.raises(EngineError) as failed:
        build(engine, python_base, context, "serving-core-test:app-openmp-broken")
    assert "serving-core check" in str(failed.value)
    assert "libgomp.so.1" in str(failed.value)


def test_a_name_that_is_not_a_debian_package_name_fails_the_build_naming_it(
    engine: Engine, python_base: bases.Resolved, tmp_path: Path
) -> None:
    context = build_context(tmp_path, system_packages=False)
    (context / HANDLER_DIR / "system-packages.txt").write_text("libgomp1 $(id)\n")
    with pytest.raises(EngineError) as failed:
        build(engine, python_base, context, "serving-core-test:app-openmp-broken")
    assert f"{HANDLER_DIR}/system-packages.txt: '$(id)' is not a Debian package name" in str(
        failed.value
    )
