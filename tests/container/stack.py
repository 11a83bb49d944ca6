"""The app and nginx containers as docker-compose.yml runs them.

The app on an internal network as "app", nginx on it and on a second network
with its port published on 127.0.0.1 (and its metrics port, which Prometheus
would scrape from inside), each with the compose file's environment, health
check, stop grace period and hardening (non-root as the images run, read-only
root, /tmp a tmpfs, no capabilities, no-new-privileges).
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from tests.container.engine import Engine, Hardening, Healthcheck, Network
from tests.servers import ROOT

HEALTHY_TIMEOUT_S = 300.0  # the app's: it loads its model first
NGINX_HEALTHY_TIMEOUT_S = 60.0
NGINX_PORT = 8080
NGINX_METRICS_PORT = 9090
# No Redis runs here: without SERVING_JOBS_URL the app keeps its job queue in
# SQLite under /tmp (which the compose file's worker would not see).
LEFT_OUT = {"SERVING_JOBS_URL"}


@dataclass(frozen=True)
class Stack:
    engine: Engine
    app: str
    nginx: str
    url: str  # nginx's API port
    metrics_url: str  # nginx's metrics port


def compose_services() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services: dict[str, Any] = compose["services"]
    return services


def seconds(duration: str) -> int:
    """A compose duration ("40s", "2m") in whole seconds."""
    found = re.fullmatch(r"(\d+)(s|m)", duration)
    if found is None:
        raise ValueError(f"unsupported compose duration {duration!r}")
    return int(found.group(1)) * (60 if found.group(2) == "m" else 1)


def hardening(spec: Mapping[str, Any]) -> Hardening:
    return Hardening(
        read_only=spec["read_only"],
        tmpfs=tuple(spec["tmpfs"]),
        cap_drop=tuple(spec["cap_drop"]),
        security_opt=tuple(spec["security_opt"]),
    )


def healthcheck(spec: Mapping[str, Any]) -> Healthcheck:
    return Healthcheck(
        test=spec["test"],
        interval=spec["interval"],
        timeout=spec["timeout"],
        start_period=spec["start_period"],
        retries=spec["retries"],
    )


def environment(spec: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in spec["environment"].items() if k not in LEFT_OUT}


@contextlib.contextmanager
def compose_stack(
    engine: Engine,
    app_image: str,
    nginx_image: str,
    app_overrides: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """Both containers, healthy; removed, and their networks, when the block ends.
    ``app_overrides`` are set over the app's environment from the compose file."""
    services = compose_services()
    app_spec, nginx_spec = services["app"], services["nginx"]
    run = f"serving-test-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as cleanup:
        backend = cleanup.enter_context(engine.network(f"{run}-backend", internal=True))
        frontend = cleanup.enter_context(engine.network(f"{run}-frontend"))
        app = cleanup.enter_context(
            engine.container(
                app_image,
                f"{run}-app",
                env={**environment(app_spec), **(app_overrides or {})},
                networks=[Network(backend, aliases=("app",))],
                hardening=hardening(app_spec),
                healthcheck=healthcheck(app_spec["healthcheck"]),
                stop_timeout_s=seconds(app_spec["stop_grace_period"]),
            )
        )
        # As depends_on: service_healthy does.
        engine.wait_healthy(app, HEALTHY_TIMEOUT_S)
        nginx = cleanup.enter_context(
            engine.container(
                nginx_image,
                f"{run}-nginx",
                env=environment(nginx_spec),
                networks=[Network(frontend), Network(backend)],
                publish=[NGINX_PORT, NGINX_METRICS_PORT],
                hardening=hardening(nginx_spec),
                stop_timeout_s=seconds(nginx_spec["stop_grace_period"]),
            )
        )
        engine.wait_healthy(nginx, NGINX_HEALTHY_TIMEOUT_S)
        yield Stack(
            engine,
            app,
            nginx,
            f"http://127.0.0.1:{engine.port(nginx, NGINX_PORT)}",
            f"http://127.0.0.1:{engine.port(nginx, NGINX_METRICS_PORT)}",
        )
