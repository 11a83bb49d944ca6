"""The workflows as data, for tests/deploy/test_*workflow*.py: loaded, their steps
and actions found, their `if:` conditions evaluated, and the tools that lint them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GITHUB = ROOT / ".github"
WORKFLOWS = GITHUB / "workflows"
SETUP_HELM = GITHUB / "actions" / "setup-helm"
BIN = Path(sys.executable).parent
NAMES = ["ci", "image", "chart", "deploy"]


def workflow(name: str) -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load((WORKFLOWS / f"{name}.yml").read_text())
    # YAML 1.1 reads the key `on` as True.
    loaded["on"] = loaded.pop(True, loaded.get("on"))
    return loaded


def steps(name: str, job: str | None = None) -> list[dict[str, Any]]:
    jobs = workflow(name)["jobs"]
    chosen = [jobs[job]] if job else list(jobs.values())
    return [step for each in chosen for step in each["steps"]]


def step_named(name: str, step_name: str, job: str | None = None) -> dict[str, Any]:
    (found,) = [s for s in steps(name, job) if s.get("name") == step_name]
    return found


def strings(value: Any) -> list[str]:
    """Every string in a loaded workflow (keys and values), comments left out."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in strings(k) + strings(v)]
    if isinstance(value, list):
        return [s for item in value for s in strings(item)]
    return [value] if isinstance(value, str) else []


def uses(name: str, action: str, job: str | None = None) -> list[dict[str, Any]]:
    return [s for s in steps(name, job) if s.get("uses", "").startswith(f"{action}@")]


def evaluate(expression: str, context: Mapping[str, Any]) -> Any:
    """An Actions `if:` expression evaluated over ``context`` (github, needs, ...).

    Covers what these workflows use: contexts, 'strings', ==, !=, !, &&, ||
    (which yield an operand, as in Actions), parentheses, startsWith
    (case-insensitive, as in Actions), format and fromJSON. A missing property
    is null, as in Actions."""

    def get(path: str) -> Any:
        value: Any = context
        for key in path.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        return value

    def starts_with(text: Any, prefix: Any) -> bool:
        return str(text or "").lower().startswith(str(prefix or "").lower())

    def format_(template: str, *args: Any) -> str:
        # Actions' {0} placeholders and {{ }} escapes are Python's.
        return template.format(*("" if a is None else a for a in args))

    contexts = "github|needs|inputs|vars|env|steps|matrix"
    token = re.compile(
        rf"'(?:[^']|'')*'|(?:{contexts})(?:\.[\w-]+)+|&&|\|\||!(?!=)"
        r"|startsWith|format|fromJSON|[()=,\s]+|!=|\S"
    )
    python = []
    for match in token.finditer(expression.strip().removeprefix("${{").removesuffix("}}")):
        part = match.group(0)
        if part.startswith("'"):
            python.append(repr(part[1:-1].replace("''", "'")))
        elif re.match(rf"^({contexts})\.", part):
            python.append(f"get({part!r})")
        else:
            python.append(
                {
                    "&&": " and ",
                    "||": " or ",
                    "!": " not ",
                    "startsWith": "starts_with",
                    "format": "format_",
                    "fromJSON": "from_json",
                }.get(part, part)
            )
    functions = {
        "get": get,
        "starts_with": starts_with,
        "format_": format_,
        "from_json": json.loads,
    }
    return eval("".join(python), {"__builtins__": {}}, functions)


def uses_lines() -> list[tuple[str, str]]:
    """Every remote action reference, in the workflows and the local actions."""
    lines = []
    for path in sorted([*WORKFLOWS.glob("*.yml"), *GITHUB.glob("actions/*/action.yml")]):
        for line in path.read_text().splitlines():
            match = re.match(r"^\s*(?:- )?uses: (.*)$", line)
            if match and not match.group(1).startswith("./"):
                lines.append((path.name, match.group(1)))
    return lines


def tool(name: str) -> str:
    found = shutil.which(name, path=f"{BIN}:/usr/bin:/usr/local/bin")
    if not found:
        pytest.fail(f"{name} is not installed; `make install-dev system-deps` installs it")
    return found


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
