"""The two images as docker-compose.yml runs them, tested through nginx.

The app image serves the handler image.yml names (images.handler_dir); its
answer to the handler's sample.json must have the shape `serving-core check`
gives here, outside the image. Both containers run as the chart runs them:
non-root, read-only root filesystem, /tmp a tmpfs, no capabilities.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.container.engine import Engine
from tests.container.images import handler_dir, sample
from tests.container.stack import Stack, compose_services, compose_stack, seconds

pytestmark = [pytest.mark.e2e, pytest.mark.container, pytest.mark.timeout(1800)]

MINILM = "handlers/minilm"
LOG_TIMEOUT_S = 30.0
# Requests in flight when the app is told to stop.
IN_FLIGHT = 32


def shape(value: Any) -> Any:
    """A JSON value's structure: keys, list lengths and the kind of each leaf."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value]
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def env_of(stack: Stack, container: str) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in stack.engine.inspect(container)["Config"]["Env"])
    return dict(pairs)


def wait_for_log(engine: Engine, container: str, text: str) -> str:
    deadline = time.monotonic() + LOG_TIMEOUT_S
    while text not in (log := engine.logs(container)):
        assert time.monotonic() < deadline, f"{text!r} not in the log of {container}:\n{log}"
        time.sleep(0.2)
    return log


def test_the_image_serves_the_handler_image_yml_names(stack: Stack) -> None:
    # The folder: a handler.py or a pipeline.yaml in it is what serves.
    assert env_of(stack, stack.app)["SERVING_HANDLER"] == handler_dir()


def test_the_handlers_sample_answers_through_nginx_as_serving_core_check_does(
    stack: Stack, expected_answer: Any
) -> None:
    response = requests.post(
        stack.url + "/predict",
        json=sample(),
        headers={"X-Request-ID": "container-test-1"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.headers["X-Request-ID"] == "container-test-1"
    assert shape(response.json()) == shape(expected_answer)


def test_minilm_answers_a_unit_norm_embedding_of_384_floats(stack: Stack) -> None:
    if handler_dir().rstrip("/") != MINILM:
        pytest.skip(f"the image serves {handler_dir()}, not {MINILM}")
    response = requests.post(
        stack.url + "/predict", json={"text": "Paris is the capital of France."}, timeout=60
    )
    assert response.status_code == 200
    embedding = response.json()["embedding"]
    assert len(embedding) == 384
    assert abs(sum(x * x for x in embedding) - 1.0) < 1e-3


def test_the_request_id_reaches_the_app_containers_log(stack: Stack) -> None:
    response = requests.post(
        stack.url + "/predict",
        json=sample(),
        headers={"X-Request-ID": "container-trace-2"},
        timeout=60,
    )
    assert response.status_code == 200
    wait_for_log(stack.engine, stack.app, "container-trace-2")


def test_an_oversized_body_gets_nginxs_json_413(stack: Stack) -> None:
    limit = int(env_of(stack, stack.nginx)["SERVING_MAX_BODY_BYTES"])
    body = b'{"text": "' + b"a" * limit + b'"}'
    response = requests.post(
        stack.url + "/predict",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "payload_too_large"


APP_ERRORS = {
    # request (method, path, body) -> status, error type
    ("GET", "/no-such-route", None): (404, "not_found"),
    ("GET", "/predict", None): (405, "method_not_allowed"),
    ("POST", "/predict", b'{"text": '): (400, "bad_request"),
}


@pytest.mark.parametrize("sent", APP_ERRORS)
def test_the_apps_json_errors_pass_through_nginx(
    stack: Stack, sent: tuple[str, str, bytes | None]
) -> None:
    method, path, body = sent
    status, kind = APP_ERRORS[sent]
    response = requests.request(
        method,
        stack.url + path,
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["type"] == kind
    # The app's message, not one of nginx's own error pages (they name nginx).
    assert "nginx" not in error.get("message", "").lower(), error


def test_nginxs_metrics_port_serves_the_apps_metrics(stack: Stack) -> None:
    requests.post(stack.url + "/predict", json=sample(), timeout=60)
    response = requests.get(stack.metrics_url + "/metrics", timeout=60)
    assert response.status_code == 200
    assert "serving_requests_total{" in response.text
    assert 'route="/predict",status="200"' in response.text


def test_the_engine_finds_both_containers_healthy(stack: Stack) -> None:
    # The app's check is the compose file's (/readyz); nginx's is its image's.
    assert stack.engine.healthy(stack.app)
    assert stack.engine.healthy(stack.nginx)


def test_the_app_images_own_healthcheck_passes_in_the_running_container(
    stack: Stack, app_image: str
) -> None:
    # Compose replaces it with /readyz; a plain `docker run` uses it. Its command,
    # run where the engine would run it.
    kind, *command = stack.engine.image_healthcheck(app_image)
    assert kind == "CMD"
    result = stack.engine.exec(stack.app, command)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("service", ["app", "nginx"])
def test_neither_container_runs_as_root(stack: Stack, service: str) -> None:
    result = stack.engine.exec(getattr(stack, service), ["id", "-u"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() not in {"", "0"}


@pytest.mark.parametrize("service", ["app", "nginx"])
def test_the_root_filesystem_is_read_only_and_tmp_a_tmpfs(stack: Stack, service: str) -> None:
    container = getattr(stack, service)
    outside = stack.engine.exec(container, ["sh", "-c", "echo x > /probe"])
    assert outside.returncode != 0
    # EROFS is checked before the file's permissions, so this is not a non-root refusal.
    assert "Read-only file system" in outside.stderr, outside.stderr
    inside = stack.engine.exec(container, ["sh", "-c", "echo x > /tmp/probe"])
    assert inside.returncode == 0, inside.stderr
    mounts = stack.engine.exec(container, ["cat", "/proc/mounts"]).stdout.splitlines()
    assert any(line.split()[1:3] == ["/tmp", "tmpfs"] for line in mounts), mounts


def test_the_app_publishes_no_port(stack: Stack) -> None:
    ports = stack.engine.inspect(stack.app)["NetworkSettings"]["Ports"] or {}
    assert not any(ports.values()), ports


@pytest.mark.parametrize("image_fixture", ["app_image", "nginx_image"])
def test_both_images_carry_oci_labels(
    stack: Stack, request: pytest.FixtureRequest, image_fixture: str
) -> None:
    labels = stack.engine.image_labels(request.getfixturevalue(image_fixture))
    for key in ("title", "source", "version", "revision", "licenses"):
        assert labels.get(f"org.opencontainers.image.{key}"), key


# --- SIGTERM: the app finishes what it accepted ---------------------------------

# The drain test's app holds every request in one batch window: one worker, a
# fixed window longer than the engine takes to deliver the stop, a batch size no
# window fills, no cache (the sample repeated would be answered from it). The
# window stays under SERVING_REQUEST_TIMEOUT_S, so no request is late.
HELD = {
    "SERVING_WORKERS": "1",
    "SERVING_BATCH_POLICY": "fixed",
    "SERVING_MAX_WAIT_MS": "5000",
    "SERVING_MAX_BATCH_SIZE": str(2 * IN_FLIGHT),
    "SERVING_CACHE_SIZE": "0",
}
QUEUE_DEPTH = re.compile(r"^serving_queue_depth(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


@pytest.fixture
def held_stack(engine: Engine, app_image: str, nginx_image: str) -> Iterator[Stack]:
    """A stack of its own (the test stops its app) whose app holds requests (HELD)."""
    with compose_stack(engine, app_image, nginx_image, app_overrides=HELD) as running:
        yield running


def queue_depth(stack: Stack) -> float:
    found = QUEUE_DEPTH.findall(requests.get(stack.metrics_url + "/metrics", timeout=60).text)
    return sum(float(value) for value in found)


def test_sigterm_to_the_app_finishes_every_request_in_flight(held_stack: Stack) -> None:
    stack = held_stack
    host, port = stack.url.removeprefix("http://").split(":")
    body = json.dumps(sample())
    connections = [
        http.client.HTTPConnection(host, int(port), timeout=120) for _ in range(IN_FLIGHT)
    ]
    statuses: list[int | str] = [0] * IN_FLIGHT

    def send_and_read(n: int) -> None:
        try:
            connections[n].request(
                "POST",
                "/predict",
                body=body,
                headers={"Content-Type": "application/json", "X-Request-ID": f"drain-{n}"},
            )
            response = connections[n].getresponse()
            response.read()
            statuses[n] = response.status
        except (OSError, http.client.HTTPException) as exc:
            statuses[n] = repr(exc)

    clients = [threading.Thread(target=send_and_read, args=(n,)) for n in range(IN_FLIGHT)]
    for client in clients:
        client.start()
    # Every request is in the app's queue, none answered, when the stop is sent.
    deadline = time.monotonic() + 60
    while (depth := queue_depth(stack)) < IN_FLIGHT:
        assert time.monotonic() < deadline, f"{depth} of {IN_FLIGHT} requests queued: {statuses}"
        time.sleep(0.05)
    assert statuses == [0] * IN_FLIGHT
    grace_s = seconds(compose_services()["app"]["stop_grace_period"])
    exit_code = stack.engine.stop(stack.app, grace_s)
    for client in clients:
        client.join(120)
    for connection in connections:
        connection.close()
    log = stack.engine.logs(stack.app)
    assert statuses == [200] * IN_FLIGHT, log
    # Drained, not killed: gunicorn took the signal, its workers finished, and
    # the engine did not have to SIGKILL it (137).
    assert exit_code == 0, log
    assert "Handling signal: term" in log, log
    assert "Shutting down: Master" in log, log
