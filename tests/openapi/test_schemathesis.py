"""schemathesis's own run over /openapi.json, every check, valid and invalid requests
(issue 42): no 5xx, and no status the document does not declare.

A real ``serving-core serve`` (gunicorn) of a small handler takes it, with API keys
and without. The CLI runs as a user would run it, with schemathesis.toml beside
this file, which tells it the rules of this API a JSON Schema cannot state (the
504 of a deadline the client set itself among them), and checks.py's own check of
that 504. The server's log must hold no traceback afterwards.

``make test`` runs a few cases per operation (SCHEMATHESIS_EXAMPLES, default 10);
``make schemathesis`` runs 500.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HANDLERS
from tests.servers import ROOT, base_env, gunicorn_server

HERE = Path(__file__).resolve().parent
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "10"))
KEY = "k1-6f0e9a8b7c6d5e4f3a2b"
RUN_TIMEOUT_S = 600

pytestmark = pytest.mark.e2e


def schemathesis_run(
    url: str, headers: dict[str, str], tmp: Path
) -> subprocess.CompletedProcess[str]:
    """``schemathesis run`` over ``url``'s /openapi.json: every check (the default),
    positive and negative cases, no database kept between runs."""
    command = [
        str(SCHEMATHESIS),
        "--config-file",
        str(HERE / "schemathesis.toml"),
        "run",
        f"{url}/openapi.json",
        "--mode",
        "all",
        "--max-examples",
        str(EXAMPLES),
        "--generation-database",
        "none",
        "--no-color",
    ]
    for name, value in headers.items():
        command += ["--header", f"{name}: {value}"]
    env = base_env({"SCHEMATHESIS_HOOKS": "tests.openapi.checks"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        command,
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize(
    "handler",
    [
        # The examples' smallest: any object in, no schema.
        pytest.param(str(ROOT / "handlers" / "echo"), marks=pytest.mark.example("echo"), id="echo"),
        # A schema with every JSON type, bounds and enums to aim at.
        pytest.param(str(HANDLERS / "fuzz" / "handler.py"), id="fuzz"),
    ],
)
@pytest.mark.parametrize("keys", [False, True], ids=["without keys", "with keys"])
def test_schemathesis_finds_no_5xx_and_no_undocumented_status(
    handler: str, keys: bool, tmp_path: Path
) -> None:
    env = {"SERVING_HANDLER": handler, "SERVING_WORKERS": "1"}
    if keys:
        env["SERVING_API_KEYS"] = KEY
    with gunicorn_server(env) as server:
        run = schemathesis_run(
            server.url, {"Authorization": f"Bearer {KEY}"} if keys else {}, tmp_path
        )
        log = server.output()
    report = run.stdout[-8000:] + run.stderr[-2000:]
    assert run.returncode == 0, f"schemathesis failed (exit {run.returncode}):\n{report}"
    assert "Traceback" not in log, f"the server logged a traceback:\n{log[-4000:]}"
