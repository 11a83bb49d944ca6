"""The package's face: the handler contract and settings, without Flask."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import serving_core

WEB = ["flask", "flask_restful", "gunicorn", "gevent", "torch"]


def loaded_after(code: str, heavy: list[str] = WEB) -> list[str]:
    probe = f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    modules = set(json.loads(result.stdout.splitlines()[-1]))
    return [name for name in heavy if name in modules]


@pytest.mark.parametrize(
    "code",
    [
        "from serving_core import Handler, InvalidInput, Settings",
        # A handler module, loaded as serve, check, batch and worker load it.
        "from serving_core.loading import load_handler; load_handler('tests/handlers/probe')",
        # The engine: check, batch and the worker run it with no web stack.
        "import serving_core.engine.engine, serving_core.process.jobmaster, serving_core.batch.run",
    ],
)
def test_the_package_and_the_cli_load_no_web_stack(code):
    assert loaded_after(code) == []


def test_the_cli_stays_light_for_the_pods_exec_probe():
    # Started every few seconds by the kubelet: not even the schema validator.
    assert (
        loaded_after("from serving_core.commands import cli", [*WEB, "jsonschema", "redis"]) == []
    )


def test_the_package_says_its_version():
    assert serving_core.__version__.count(".") >= 2
    assert set(serving_core.__all__) == {
        "Final",
        "Generation",
        "Handler",
        "InvalidInput",
        "Settings",
        "Tensor",
        "Tensors",
        "TextGeneration",
        "__version__",
    }
