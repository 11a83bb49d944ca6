"""The import rules in pyproject.toml bite: each, reversed on a scratch copy, fails lint-imports."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


VERDICT = re.compile(r"^(?P<name>.+) (?P<verdict>KEPT|BROKEN)( \(\d+ ignored imports?\))?$")


def verdicts(output: str) -> dict[str, str]:
    """Each contract's name and KEPT or BROKEN, from lint-imports' summary."""
    found = (VERDICT.match(line) for line in output.splitlines())
    return {m["name"]: m["verdict"] for m in found if m}


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH puts the copy ahead of the editable install's finder, so the
    # graph is built from the copy's files.
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=tree,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "serving_core", tmp_path / "serving_core")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def add_line(path: Path, line: str) -> None:
    # After the module's docstring and its `from __future__` line.
    text = path.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text, path
    path.write_text(text.replace(marker, marker + line + "\n", 1))


def test_the_package_keeps_every_rule(tree: Path) -> None:
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    found = verdicts(result.stdout)
    assert len(found) == 8, result.stdout
    assert set(found.values()) == {"KEPT"}, result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("engine/engine.py", "import flask", "Flask and werkzeug are imported only in web"),
        ("online/service.py", "import gunicorn", "gunicorn and gevent are imported only in"),
        ("modelprocess/client.py", "import gevent", "gunicorn and gevent are imported only in"),
        (
            "modelprocess/main.py",
            "import serving_core.online.service",
            "The layers point down only",
        ),
        ("engine/engine.py", "import serving_core.web.app", "The layers point down only"),
        # The handler contract's modules are the bottom row: nothing above them.
        ("handler.py", "import serving_core.encoding", "The layers point down only"),
        ("settings/parsers.py", "import serving_core.online.service", "The layers point down only"),
        ("process/hooks.py", "import grpc", "grpcio and protobuf are imported only in grpc"),
        ("engine/engine.py", "from google.protobuf import message", "grpcio and protobuf are"),
        ("web/docs.py", "import flask_swagger_ui", "flask-swagger-ui is read as files"),
        # The consumers' loops run in forked processes, but know nothing of forking.
        ("loops/stream.py", "import serving_core.process.prefork", "The layers point down only"),
        ("loops/jobs.py", "import gevent", "gunicorn and gevent are imported only in"),
        ("grpc/codec.py", "import serving_core.web.app", "The layers point down only"),
        # A pipeline's gRPC client is handed down (pipeline.transport), never imported.
        ("pipeline/client.py", "import serving_core.grpc.stage", "The layers point down only"),
        ("pipeline/client.py", "import serving_core.grpc.codec", "The layers point down only"),
        ("jobs/base.py", "import serving_core.jobs.sqlite.queue", "No import cycles"),
        # The stores' client is the model fetcher's alone; it knows nothing of serving.
        ("cache/store.py", "import obstore", "obstore is imported only in artifacts"),
        ("artifacts/parts.py", "import serving_core.engine.engine", "The layers point down"),
        # Traces off load no OpenTelemetry: only tracing imports it, and only once on.
        ("engine/batcher.py", "import opentelemetry", "opentelemetry is imported only in tracing"),
        ("tracing/tracer.py", "import serving_core.engine.batcher", "The layers point down"),
    ],
)
def test_a_reversed_rule_fails(tree: Path, module: str, line: str, broken: str) -> None:
    add_line(tree / "serving_core" / module, line)
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    # That contract (a reversed layer may break others too, e.g. make a cycle),
    # and the report names the module we changed.
    found = verdicts(result.stdout)
    assert len(found) == 8, result.stdout
    assert [v for name, v in found.items() if name.startswith(broken)] == ["BROKEN"], result.stdout
    leaf = module.removesuffix(".py").replace("/", ".")
    assert f"serving_core.{leaf}" in result.stdout or f".{leaf.split('.')[-1]}" in result.stdout


def test_the_root_package_is_held_to_the_stack_rules(tree: Path) -> None:
    # Every handler module loads serving_core/__init__.py: it stays off the web stack.
    init = tree / "serving_core" / "__init__.py"
    init.write_text(init.read_text() + "\nimport flask\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    found = verdicts(result.stdout)
    assert found["Flask and werkzeug are imported only in web and process"] == "BROKEN"
    assert "serving_core -> flask" in result.stdout


def test_a_new_package_is_held_to_the_stack_rules_with_no_edit(tree: Path) -> None:
    # The stack contracts name who may import a stack, not who may not.
    package = tree / "serving_core" / "newpart"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package the contracts do not name."""\n')
    (package / "run.py").write_text('"""Reaches for gunicorn."""\n\nimport gunicorn\n')
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    found = verdicts(result.stdout)
    assert found["gunicorn and gevent are imported only in process"] == "BROKEN", result.stdout
    assert "serving_core.newpart.run -> gunicorn" in result.stdout
