"""Which images the container tests build, with what, and the run's report.

The app image serves the handler .github/workflows/image.yml names (its
``env: HANDLER_DIR``, as CI builds it; SERVING_TEST_HANDLER_DIR overrides), with
image.yml's SHARED_DIRS and the TORCH_INDEX_URL that `make test` exports.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.container.engine import Engine
from tests.servers import ROOT, image_workflow_env, served_handler_dir

REPORT: list[str] = []  # the run's engine, bases, images and build times, printed at the end


def handler_dir() -> str:
    """The handler the app image serves, relative to the repository root."""
    return os.environ.get("SERVING_TEST_HANDLER_DIR") or served_handler_dir()


def sample() -> dict[str, Any]:
    path = ROOT / handler_dir() / "sample.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: the container tests post the handler's sample.json")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def torch_index_args() -> dict[str, str]:
    """TORCH_INDEX_URL as `make test` exports it (empty: PyPI alone); unset: the Dockerfile's."""
    value = os.environ.get("TORCH_INDEX_URL")
    return {} if value is None else {"TORCH_INDEX_URL": value}


def app_build_args() -> dict[str, str]:
    """The app image's build arguments, as image.yml passes them."""
    return {
        "HANDLER_DIR": handler_dir(),
        "SHARED_DIRS": image_workflow_env().get("SHARED_DIRS", ""),
        **torch_index_args(),
    }


def build_timed(engine: Engine, what: str, context: Path, tag: str, **kwargs: Any) -> None:
    """``engine.build``, its time in the report."""
    started = time.monotonic()
    engine.build(context, tag, **kwargs)
    REPORT.append(f"{what}: built {tag} in {time.monotonic() - started:.0f} s")
