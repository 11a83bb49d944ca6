"""The example handlers a template's owner deletes (README, "Your model", step 5), and
their tests, which go with them.

A test of one is marked ``@pytest.mark.example("NAME")`` (or its module's
``pytestmark`` is); a module that imports what only that example's requirements
install calls ``example_module("NAME", module)`` at its top. Once ``handlers/NAME``
is gone from the repository (the folder beside the rootdir's pyproject), such tests
are not collected: a module that needs the example whole (its ``pytestmark``, its
``example_module``) is not even imported, the other marked tests are deselected, and
the run says so in one line at its end, rather than as a skip per test whose reason
a reader must read to learn it is no fault.
The hooks are tests/conftest.py's.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


@dataclass
class LeftOut:
    """What a run left out for deleted examples, for its last line."""

    folders: set[str] = field(default_factory=set)
    tests: int = 0
    modules: int = 0


_LEFT_OUT = pytest.StashKey[LeftOut]()


def _handlers(config: pytest.Config) -> Path:
    return config.rootpath / "handlers"


def gone(names: tuple[str, ...], handlers: Path) -> list[str]:
    """``handlers/NAME`` for each of ``names`` whose folder is not in ``handlers``."""
    return [f"handlers/{name}" for name in names if not (handlers / name).is_dir()]


def example_module(example: str, module: str) -> ModuleType:
    """``module``, which only handlers/``example``'s requirements install, imported at
    the top of that example's test module (which is not collected once the example is
    deleted; the skip is for a module imported some other way)."""
    if folders := gone((example,), Path(__file__).resolve().parent.parent / "handlers"):
        pytest.skip(_reason(folders), allow_module_level=True)
    return importlib.import_module(module)


def _reason(folders: list[str]) -> str:
    return f"{', '.join(folders)} was deleted from this repository: this test of it does not apply"


def _module_examples(path: Path) -> tuple[str, ...]:
    """The examples a whole test module needs, read before it is imported (which fails,
    or skips, without them): those of its ``example_module("NAME", ...)`` calls and of
    the ``pytest.mark.example("NAME")`` in its module-level ``pytestmark``."""
    source = path.read_text(encoding="utf-8")
    if "example_module(" not in source and "pytestmark" not in source:
        return ()
    tree = ast.parse(source, str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _named(node.func, "example_module"):
            names += _strings(node.args[:1])
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(
            _named(target, "pytestmark") for target in statement.targets
        ):
            for node in ast.walk(statement.value):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    names += _strings(node.args) if node.func.attr == "example" else []
    return tuple(names)


def _named(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _strings(args: list[ast.expr]) -> list[str]:
    return [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _left_out(config: pytest.Config) -> LeftOut:
    return config.stash.setdefault(_LEFT_OUT, LeftOut())


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if folders := gone(_module_examples(collection_path), _handlers(config)):
        _left_out(config).folders.update(folders)
        _left_out(config).modules += 1
        return True
    return None


# Last: what -m and -k leave out is not counted as the examples'.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, deselected = [], []
    for item in items:
        if folders := _deleted(item):
            _left_out(config).folders.update(folders)
            deselected.append(item)
        else:
            kept.append(item)
    if deselected:
        _left_out(config).tests += len(deselected)
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def _deleted(item: pytest.Item) -> list[str]:
    names = tuple(name for mark in item.iter_markers("example") for name in mark.args)
    return gone(names, _handlers(item.config))


# First, before the fixtures start anything: a test of a deleted example that was run
# all the same (deselection at collection is the rule) skips, saying why.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if folders := _deleted(item):
        pytest.skip(_reason(folders))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    left = config.stash.get(_LEFT_OUT, None)
    if left is None or not left.folders:
        return
    counted = [f"{left.tests} test{'s' * (left.tests != 1)}"] if left.tests else []
    counted += [f"{left.modules} test module{'s' * (left.modules != 1)}"] if left.modules else []
    terminalreporter.write_line(
        f"example handlers deleted from this repository ({', '.join(sorted(left.folders))}): "
        f"not collected, their {' and '.join(counted)}"
    )
