"""tests/example_handlers.py in a run of pytest of its own, over a scratch project whose
handlers/ holds one example of two: the deleted one's tests are not collected, neither
run nor skipped, and the run's end says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.servers import ROOT

FILES = {
    "pyproject.toml": (
        "[tool.pytest.ini_options]\n"
        'markers = ["example(*names): an example\'s", "e2e: real servers"]\n'
    ),
    "conftest.py": 'pytest_plugins = ["tests.example_handlers"]\n',
    "handlers/kept/handler.py": "",
    "test_marked.py": (
        "import pytest\n\n"
        '@pytest.mark.example("kept")\ndef test_kept(): pass\n\n'
        '@pytest.mark.example("gone")\ndef test_gone(): pass\n\n'
        '@pytest.mark.example("kept", "gone")\ndef test_both(): pass\n\n'
        "def test_plain(): pass\n"
    ),
    # A module of the deleted example's whole, which could not even be imported.
    "test_whole.py": (
        "import pytest\nimport no_such_module_either\n\n"
        'pytestmark = [pytest.mark.e2e, pytest.mark.example("gone")]\n\n'
        "def test_it(): pass\n"
    ),
    # Imports what only the deleted example's requirements would install.
    "test_imports.py": (
        "from tests.example_handlers import example_module\n\n"
        'example_module("gone", "no_such_module_anywhere")\n\n'
        "def test_it(): pass\n"
    ),
}


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = str(ROOT)  # tests.example_handlers, as the suite imports it
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def scratch(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_deleted_examples_tests_are_not_collected_and_the_run_says_so_once(
    tmp_path: Path,
) -> None:
    result = run_pytest(scratch(tmp_path))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "2 passed, 2 deselected" in out.splitlines()[-1], out
    assert "skipped" not in out.lower(), out
    assert "PASSED test_marked.py::test_kept" in out
    assert "PASSED test_marked.py::test_plain" in out
    assert (
        "example handlers deleted from this repository (handlers/gone): not collected, "
        "their 2 tests and 2 test modules"
    ) in out, out


def test_with_every_example_there_nothing_is_left_out(tmp_path: Path) -> None:
    project = scratch(tmp_path)
    (project / "handlers" / "gone").mkdir()
    # Two modules import what no example installs: an ImportError, as it should be.
    result = run_pytest(project, "--ignore", "test_imports.py", "--ignore", "test_whole.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed in" in result.stdout.splitlines()[-1], result.stdout
    assert "example handlers deleted" not in result.stdout
