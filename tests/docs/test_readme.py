"""The code of README.md and docs/, run as written: every ```python block under
pytest-markdown-docs, and every shell block not marked ``notest`` by a test here or by
the fresh-clone test.

The convention (docs/development.md, "These docs"): a fenced block is run by the suite unless
its info string says ``notest`` (```` ```bash notest ````), and then the sentence
before it says why. ``CLAIMS`` names the test that runs each shell block; a new
block that no test claims fails ``test_every_shell_block_is_run_or_marked_notest``.
Servers are real (gunicorn on 127.0.0.1); a block's ``127.0.0.1:8000`` and
``127.0.0.1:9090`` become free ports, the session's ``SERVING_BIND`` stands for the
default address, and ``SERVING_JOBS_PATH`` is a file of the test's own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from tests import readme
from tests.readme import block_with, commands, shell, shell_blocks
from tests.servers import ROOT, free_port, gunicorn_server, served_handler_dir

# The command lines that only a fresh clone can run for real (they install, or
# run the whole suite): tests/deploy/test_template.py checks that the README says them
# and runs their steps in a fresh clone, make check and make upgrade included.
FRESH_CLONE = (
    "tests/deploy/test_template.py (a fresh clone made the owner's: make check, make upgrade,"
    " make check)"
)
# A unique piece of each shell block that is run -> the test that runs it.
CLAIMS = {
    "make serve      # installs": "test_the_quick_start_calls_the_server_and_checks_the_handler",
    '-d \'{"text": "Paris is the capital of France."}\' 127.0.0.1:8000/predict': (
        "test_the_quick_start_calls_the_server_and_checks_the_handler"
    ),
    "serving-core check handlers/minilm": (
        "test_the_quick_start_calls_the_server_and_checks_the_handler"
    ),
    "make upgrade    # from": FRESH_CLONE,
    "serving-core init sentiment": "test_the_five_steps_serve_the_readme_handler_with_a_real_model",
    # Served with `serving-core serve`, what make serve runs once installed: make serve
    # itself would install into the suite's own venv from a scratch project.
    "SERVING_HANDLER=handlers/sentiment make serve": (
        "test_the_five_steps_serve_the_readme_handler_with_a_real_model"
    ),
    "curl -d @handlers/sentiment/sample.json": (
        "test_the_five_steps_serve_the_readme_handler_with_a_real_model"
    ),
    "HANDLER_DIR: handlers/sentiment|' .github/workflows/image.yml": (
        "test_step_five_points_image_yml_at_the_handler_and_drops_the_examples (and the"
        " fresh-clone test, make check included)"
    ),
    "export SERVING_HANDLER=handlers/sentiment": (
        "tests/docs/test_readme_jobs.py::test_the_jobs_example_runs_the_job_through_its_worker"
    ),
    "SERVING_FOLLOWUP_QUEUE=all-minilm-l6-v2 serving-core serve &": (
        "tests/docs/test_readme_jobs.py::test_the_time_lag_example_answers_now_and_fills_in_later"
    ),
    "SERVING_STREAM_SINK='redis://127.0.0.1:6390": (
        "tests/docs/test_readme_streams.py::"
        "test_the_local_stream_example_echoes_one_message_and_dead_letters_the_other"
    ),
}


def test_every_shell_block_is_run_or_marked_notest() -> None:
    unclaimed = []
    for block in shell_blocks():
        claims = [key for key in CLAIMS if key in block.text]
        assert len(claims) <= 1, f"{block} holds several claimed pieces: {claims}"
        if block.tested and not claims:
            unclaimed.append(str(block))
        if not block.tested:
            assert not claims, f"{block} is marked notest, yet {CLAIMS[claims[0]]} runs it"
    assert not unclaimed, (
        f"{unclaimed}: run each in a test and name it in tests/docs/test_readme.py's CLAIMS, or "
        "mark it an illustration (```bash notest) and say why in the sentence before it"
    )
    for key in CLAIMS:
        block_with(key)  # each claim is in exactly one block


def test_the_python_blocks_run_under_pytest_markdown_docs(tmp_path: Path) -> None:
    """pytest-markdown-docs runs each ```python block of README.md and docs/ (its own
    runner: a new pytest, so its --markdown-docs flag reaches no other file of the suite)."""
    expected = [b for b in readme.blocks() if b.language in ("python", "py") and b.tested]
    assert expected, "README.md and docs/ have no ```python block to run"
    command = [sys.executable, "-m", "pytest", "--markdown-docs", "-p", "no:cacheprovider"]
    report = subprocess.run(
        [*command, "-q", "--rootdir", str(ROOT), *map(str, readme.pages())],
        cwd=tmp_path,  # a block that writes files writes them here
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.returncode == 0, report.stdout + report.stderr
    assert re.search(rf"\b{len(expected)} passed\b", report.stdout), report.stdout


def session_env(tmp_path: Path, api_bind: str = "") -> dict[str, str]:
    env = {"SERVING_JOBS_PATH": str(tmp_path / "jobs.db")}
    return {**env, "SERVING_BIND": api_bind} if api_bind else env


def ported(text: str, api_bind: str, worker_bind: str = "") -> str:
    text = text.replace("127.0.0.1:8000", api_bind)
    return text.replace("127.0.0.1:9090", worker_bind) if worker_bind else text


ACTIVATE = commands(block_with("serving-core check handlers/minilm").text)[0]


@pytest.mark.e2e
@pytest.mark.model
@pytest.mark.example("minilm")
def test_the_quick_start_calls_the_server_and_checks_the_handler(tmp_path: Path) -> None:
    """`make serve` as written (the session's SERVING_BIND, a free port, stands for its
    default address), then the curl and the check from a second shell."""
    if served_handler_dir() != "handlers/minilm":
        pytest.skip("image.yml serves another handler: the quick start is the template's")
    installed = subprocess.run(["make", "--question", "install"], cwd=ROOT, check=False)
    if installed.returncode != 0:
        pytest.skip("`make serve` would install first: run `make install` (make test does)")
    assert ACTIVATE.startswith(". .venv/bin/activate ")
    bind = f"127.0.0.1:{free_port()}"
    [serve] = commands(block_with("make serve      # installs").text)
    with shell(ROOT, session_env(tmp_path, bind), tmp_path / "shell") as session:
        session.start(serve, f"http://{bind}/readyz")
        curl = block_with('127.0.0.1:8000/predict\n# {"embedding"')
        [call] = session.run_block(ported(curl.text, bind), ready=[])
        [activate, check] = session.run_block(
            block_with("serving-core check handlers/minilm").text, ready=[]
        )
    assert call.returncode == 0, call
    embedding = json.loads(call.output)["embedding"]
    assert len(embedding) == 384
    assert abs(sum(x * x for x in embedding) - 1) < 1e-3  # unit norm, as the comment says
    assert activate.returncode == 0, activate
    assert check.returncode == 0, check
    assert len(json.loads(check.output)["embedding"]) == 384


@pytest.mark.e2e
def test_the_five_steps_serve_the_readme_handler_with_a_real_model(tmp_path: Path) -> None:
    project = readme.project(tmp_path / "project")
    with shell(project, session_env(tmp_path), tmp_path / "shell") as session:
        assert session.run(ACTIVATE).returncode == 0
        # Step 1, as written.
        [init] = session.run_block(block_with("serving-core init sentiment").text, ready=[])
        assert init.returncode == 0, init
        folder = project / "handlers" / "sentiment"
        assert sorted(p.name for p in folder.iterdir()) == [
            "handler.py",
            "requirements.txt",
            "sample.json",
        ]
        # Step 2: the README's handler.py over the skeleton, and a model of the user's.
        readme.put_the_readme_handler(folder)
        check = session.run("serving-core check handlers/sentiment")
        assert check.returncode == 0, check
    # Step 3: serve it (make serve runs `serving-core serve` on it) and call it as written.
    served = {"SERVING_HANDLER": str(folder), "SERVING_WORKERS": "1"}
    with (
        gunicorn_server(served) as server,
        shell(project, session_env(tmp_path, server.bind), tmp_path / "shell3") as session,
    ):
        curl = block_with("curl -d @handlers/sentiment/sample.json")
        [call] = session.run_block(ported(curl.text, server.bind), ready=[])
        # The skeleton's check, kept by the README's handler: blank text is no sentiment.
        blank = requests.post(f"http://{server.bind}/predict", json={"text": "   "}, timeout=60)
    assert call.returncode == 0, call
    assert json.loads(call.output) in ({"label": "positive"}, {"label": "negative"}), call
    assert blank.status_code == 400, blank.text
    assert "more than whitespace" in blank.text


def test_step_five_points_image_yml_at_the_handler_and_drops_the_examples(
    tmp_path: Path,
) -> None:
    """The step's commands but `make check` (the fresh-clone test runs that one), in a
    repository holding image.yml and two example handlers beside the user's new one."""
    repo = tmp_path / "repo"
    workflow = repo / ".github" / "workflows" / "image.yml"
    workflow.parent.mkdir(parents=True)
    # The template's image.yml, naming an example handler (as a fresh clone's does).
    original = re.sub(
        r"(?m)^  HANDLER_DIR: .*$",
        "  HANDLER_DIR: handlers/minilm",
        (ROOT / ".github" / "workflows" / "image.yml").read_text(),
    )
    workflow.write_text(original)
    for example in ("echo", "minilm"):
        (repo / "handlers" / example).mkdir(parents=True)
        (repo / "handlers" / example / "handler.py").write_text("# an example\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "template"], check=True)
    (repo / "handlers" / "sentiment").mkdir()
    (repo / "handlers" / "sentiment" / "handler.py").write_text("# the user's\n")
    step = block_with("HANDLER_DIR: handlers/sentiment|' .github/workflows/image.yml")
    lines = [c for c in commands(step.text) if not c.startswith("make ")]
    assert len(lines) == len(commands(step.text)) - 1  # only `make check` is left out
    with shell(repo, {}, tmp_path / "shell") as session:
        for command in lines:
            ran = session.run(command)
            assert ran.returncode == 0, ran
    after = workflow.read_text()
    changed = [
        (old, new)
        for old, new in zip(original.splitlines(), after.splitlines(), strict=True)
        if old != new
    ]
    assert changed == [("  HANDLER_DIR: handlers/minilm", "  HANDLER_DIR: handlers/sentiment")]
    assert yaml.safe_load(after)["env"]["HANDLER_DIR"] == "handlers/sentiment"
    tracked = subprocess.run(
        ["git", "-C", str(repo), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked == [".github/workflows/image.yml", "handlers/sentiment/handler.py"]
    assert not (repo / "handlers" / "echo").exists()
