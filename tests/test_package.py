"""The package's face: the handler contract and settings, without Flask."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import serving_core

HEAVY = ["flask", "flask_restful", "jsonschema", "gunicorn", "gevent", "torch"]


def loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    modules = set(json.loads(result.stdout.splitlines()[-1]))
    return [name for name in HEAVY if name in modules]


@pytest.mark.parametrize(
    "code",
    [
        "from serving_core import Handler, InvalidInput, Settings",
        # The pods' exec probe: started every few seconds, so it must stay light.
        "from serving_core import cli",
    ],
)
def test_the_package_and_the_cli_load_no_web_stack(code):
    assert loaded_after(code) == []


def test_the_package_says_its_version():
    assert serving_core.__version__.count(".") >= 2
    assert set(serving_core.__all__) == {"Handler", "InvalidInput", "Settings", "__version__"}
