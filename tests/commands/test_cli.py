from __future__ import annotations

import json
import subprocess
import textwrap
import tomllib

import pytest
import requests

from serving_core.commands import cli
from tests.servers import ROOT, SERVING_CORE, base_env, gunicorn_server

STREAM_ENDS = ("SOURCE", "SINK", "DEAD_LETTER")


def check(*args):
    return subprocess.run(
        [str(SERVING_CORE), "check", *args],
        cwd=ROOT,
        env=base_env({}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.example("echo")
def test_check_runs_the_sample_and_prints_the_output():
    result = check("handlers/echo/handler.py")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"echo": {"text": "hello"}}


@pytest.mark.example("echo")
def test_check_takes_params_on_the_command_line():
    result = check("handlers/echo", "--params", '{"a": 1}')
    assert json.loads(result.stdout) == {"echo": {"a": 1}}


@pytest.mark.example("minilm")
@pytest.mark.model
def test_check_runs_the_minilm_sample():
    result = check("handlers/minilm/handler.py")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["embedding"]) == 384


def test_check_names_the_file_of_a_broken_handler(tmp_path):
    (tmp_path / "handler.py").write_text("x = 1\n")
    result = check(str(tmp_path / "handler.py"))
    assert result.returncode == 2
    assert f"{tmp_path / 'handler.py'}: no Handler subclass found" in result.stderr


def test_check_reports_a_predict_batch_that_breaks_the_contract(tmp_path):
    (tmp_path / "handler.py").write_text(
        textwrap.dedent(
            """
            from serving_core import Handler

            class Short(Handler):
                def predict_batch(self, batch):
                    return []
            """
        )
    )
    (tmp_path / "sample.json").write_text('{"text": "x"}')
    result = check(str(tmp_path))
    assert result.returncode == 1
    assert "Short.predict_batch returned 0 outputs for 1 inputs" in result.stderr


@pytest.mark.example("minilm")
def test_check_reports_invalid_params():
    result = check("handlers/minilm/handler.py", "--params", '{"txt": 1}')
    assert result.returncode == 1
    assert "'text' is a required property" in result.stderr


@pytest.mark.example("echo")
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["healthcheck"], {"SERVING_WORKERS": "zero"}, "SERVING_WORKERS='zero' is not an integer"),
        (["serve"], {"SERVING_HANDLER": "nowhere"}, "handler module 'nowhere' was not found"),
        # The verb's argument wins over SERVING_HANDLER, for serve, worker and stream.
        (["serve", "elsewhere"], {}, "handler module 'elsewhere' was not found"),
        (["worker", "elsewhere"], {}, "handler module 'elsewhere' was not found"),
        (
            ["stream", "elsewhere"],
            {f"SERVING_STREAM_{end}": "redis://127.0.0.1:1/0?stream=s" for end in STREAM_ENDS},
            "handler module 'elsewhere' was not found",
        ),
        (["check", "handlers/echo", "--params", "{"], {}, "--params is not JSON: "),
        (["check", "handlers/echo", "--params", "[1]"], {}, "must be a JSON object"),
    ],
)
def test_a_command_that_cannot_start_exits_2_with_one_line_saying_why(args, env, message):
    result = subprocess.run(
        [str(SERVING_CORE), *args],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("serving-core: error: ")
    assert message in result.stderr
    assert result.stdout == ""


@pytest.mark.example("echo")
@pytest.mark.e2e
@pytest.mark.parametrize("unix", [False, True])
def test_healthcheck_follows_the_bind_tcp_or_unix_socket(tmp_path, unix):
    env = {"SERVING_HANDLER": "handlers/echo/handler.py", "SERVING_WORKERS": "1"}
    if unix:
        env["SERVING_BIND"] = f"unix:{tmp_path / 'app.sock'}"
    with gunicorn_server(env) as server:
        healthy = healthcheck({"SERVING_BIND": server.bind})
        missing = healthcheck({"SERVING_BIND": server.bind}, "--path", "/nowhere")
    assert healthy.returncode == 0, healthy.stderr
    assert missing.returncode == 1
    assert "404" in missing.stderr
    down = healthcheck({"SERVING_BIND": server.bind})
    assert down.returncode == 1


def test_version_names_the_installed_package():
    result = subprocess.run(
        [str(SERVING_CORE), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.startswith("serving-core ")
    assert result.stdout.split()[1][0].isdigit()


def test_version_of_a_checkout_never_installed_is_its_pyprojects():
    # The installed package answers first; a distribution that is not installed
    # stands for a checkout run with PYTHONPATH=.
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cli._version("serving-core-not-installed") == (
        f"{version} (a source checkout, not installed)"
    )


@pytest.mark.example("echo")
@pytest.mark.e2e
def test_serve_takes_the_handler_as_its_argument():
    with gunicorn_server(
        {"SERVING_HANDLER": "nowhere", "SERVING_WORKERS": "1"}, args=["handlers/echo"]
    ) as server:
        answer = requests.post(f"{server.url}/predict", json={"text": "hi"}, timeout=10)
    assert answer.json() == {"echo": {"text": "hi"}}


def healthcheck(env, *args):
    return subprocess.run(
        [str(SERVING_CORE), "healthcheck", *args],
        cwd=ROOT,
        env=base_env(env),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
