"""The two images as docker-compose.yml runs them, driven by the docker SDK.

Needs a Docker engine (GitHub Actions has one; our machines do not): without
one every test here is skipped, saying so. The images come from
SERVING_TEST_IMAGE / SERVING_TEST_NGINX_IMAGE when CI has built them already,
otherwise they are built here from the Dockerfiles (minutes: torch).

The app image serves the handler in SERVING_TEST_HANDLER_DIR (image.yml sets it
from the HANDLER_DIR it builds with; the Dockerfile's default otherwise): the
tests post that handler's sample.json, and check MiniLM's answer only when it
is MiniLM.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
import yaml

from tests.container.dockerfile import parse
from tests.servers import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

HEALTHY_TIMEOUT_S = 300.0
MINILM = "handlers/minilm"


def handler_dir() -> str:
    """The handler the app image serves, relative to the repository root."""
    default = parse(ROOT / "Dockerfile")[0].args()["HANDLER_DIR"]
    return os.environ.get("SERVING_TEST_HANDLER_DIR") or default


def sample() -> dict[str, Any]:
    path = ROOT / handler_dir() / "sample.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: the container tests post the handler's sample.json")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def engine() -> Any:
    """A client for the Docker engine, or a skip that says why there is none."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        pytest.skip("no Docker engine reachable: DOCKER_HOST is unset, /var/run/docker.sock absent")
    reason = ""
    # The SDK leaks its socket when the engine does not answer; that ResourceWarning
    # is its bug, not ours, and must not fail the run (filterwarnings = error).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            client = docker.from_env(timeout=600)
            client.ping()
        except docker.errors.DockerException as exc:
            reason = str(exc)
        gc.collect()
    if reason:
        pytest.skip(f"no Docker engine reachable: {reason}")
    return client


def seconds(duration: str) -> int:
    """A compose duration ("5s", "2m") in nanoseconds, as the engine API wants."""
    units = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
    for suffix in ("ms", "s", "m", "h"):
        if duration.endswith(suffix):
            return int(float(duration[: -len(suffix)]) * units[suffix])
    raise ValueError(f"unsupported duration {duration!r}")


def healthcheck(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "test": spec["test"],
        "interval": seconds(spec["interval"]),
        "timeout": seconds(spec["timeout"]),
        "start_period": seconds(spec["start_period"]),
        "retries": spec["retries"],
    }


def image(client: Any, variable: str, context: str, build_args: dict[str, str]) -> str:
    """The image CI built (named by ``variable``), or one built here and kept as a cache."""
    name = os.environ.get(variable)
    if name:
        client.images.get(name)
        return name
    tag = "serving-core:test-local" if context == "." else "serving-core-nginx:test-local"
    client.images.build(
        path=str(ROOT / context), tag=tag, buildargs=build_args, rm=True, forcerm=True
    )
    return tag


def wait_healthy(container: Any, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        container.reload()
        state = container.attrs["State"]
        if state["Status"] != "running":
            raise AssertionError(f"{container.name} stopped:\n{container.logs().decode()}")
        if state.get("Health", {}).get("Status") == "healthy":
            return
        time.sleep(1)
    raise AssertionError(f"{container.name} not healthy in {timeout_s} s:\n{container.logs()!r}")


@dataclass
class Stack:
    app: Any
    nginx: Any
    url: str


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    client = engine()
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    app_spec, nginx_spec = services["app"], services["nginx"]
    # The compose file's args are ${VAR:-default} for the shell; here they are given.
    build_args = {"HANDLER_DIR": handler_dir(), "TORCH_VARIANT": "cpu"}
    app_image = image(client, "SERVING_TEST_IMAGE", ".", build_args)
    nginx_image = image(client, "SERVING_TEST_NGINX_IMAGE", "nginx", {})
    run_id = uuid.uuid4().hex[:8]
    hardening = {
        "read_only": True,
        "tmpfs": {"/tmp": ""},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"],
    }
    with contextlib.ExitStack() as cleanup:
        backend = client.networks.create(f"serving-test-backend-{run_id}", internal=True)
        cleanup.callback(backend.remove)
        frontend = client.networks.create(f"serving-test-frontend-{run_id}")
        cleanup.callback(frontend.remove)

        app = client.containers.create(
            app_image,
            name=f"serving-test-app-{run_id}",
            environment={k: str(v) for k, v in app_spec["environment"].items()},
            healthcheck=healthcheck(app_spec["healthcheck"]),
            network=backend.name,
            networking_config={backend.name: client.api.create_endpoint_config(aliases=["app"])},
            **hardening,
        )
        cleanup.callback(app.remove, force=True)
        app.start()
        wait_healthy(app)

        nginx = client.containers.create(
            nginx_image,
            name=f"serving-test-nginx-{run_id}",
            environment={k: str(v) for k, v in nginx_spec["environment"].items()},
            network=frontend.name,
            ports={"8080/tcp": ("127.0.0.1", None)},
            **hardening,
        )
        cleanup.callback(nginx.remove, force=True)
        backend.connect(nginx)
        nginx.start()
        wait_healthy(nginx, timeout_s=60)
        nginx.reload()
        port = nginx.attrs["NetworkSettings"]["Ports"]["8080/tcp"][0]["HostPort"]
        yield Stack(app, nginx, f"http://127.0.0.1:{port}")


def test_the_image_serves_the_handler_it_was_built_with(stack: Stack) -> None:
    # The folder: a handler.py or a pipeline.yaml in it is what serves.
    assert _env(stack.app)["SERVING_HANDLER"] == handler_dir()


def test_the_stack_answers_the_handlers_sample_through_nginx(stack: Stack) -> None:
    response = requests.post(
        stack.url + "/predict",
        json=sample(),
        headers={"X-Request-ID": "container-test-1"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert isinstance(response.json(), dict)
    assert response.headers["X-Request-ID"] == "container-test-1"


def test_minilm_answers_a_unit_norm_embedding_of_384_floats(stack: Stack) -> None:
    if handler_dir().rstrip("/") != MINILM:
        pytest.skip(f"the image serves {handler_dir()}, not {MINILM}")
    response = requests.post(
        stack.url + "/predict", json={"text": "Paris is the capital of France."}, timeout=30
    )
    assert response.status_code == 200
    embedding = response.json()["embedding"]
    assert len(embedding) == 384
    assert abs(sum(x * x for x in embedding) - 1.0) < 1e-3


def test_the_request_id_reaches_the_app_containers_log(stack: Stack) -> None:
    requests.post(
        stack.url + "/predict",
        json=sample(),
        headers={"X-Request-ID": "container-trace-2"},
        timeout=30,
    )
    deadline = time.monotonic() + 10
    while b"container-trace-2" not in stack.app.logs():
        assert time.monotonic() < deadline, stack.app.logs().decode()
        time.sleep(0.2)


def test_an_oversized_body_gets_nginxs_json_413(stack: Stack) -> None:
    limit = int(_env(stack.nginx)["SERVING_MAX_BODY_BYTES"])
    body = b'{"text": "' + b"a" * limit + b'"}'
    response = requests.post(
        stack.url + "/predict",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"


def test_the_app_publishes_no_port_and_neither_container_runs_as_root(stack: Stack) -> None:
    stack.app.reload()
    assert not any(stack.app.attrs["NetworkSettings"]["Ports"].values())
    for container in (stack.app, stack.nginx):
        code, out = container.exec_run(["id", "-u"])
        assert code == 0
        assert out.decode().strip() != "0", container.name


def test_the_app_image_carries_oci_labels(stack: Stack) -> None:
    labels = stack.app.image.labels
    for key in ("title", "source", "version", "revision", "licenses"):
        assert labels.get(f"org.opencontainers.image.{key}"), key


def _env(container: Any) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in container.attrs["Config"]["Env"])
    return dict(pairs)
