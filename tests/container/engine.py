"""A container engine driven through its CLI: ``docker`` where ``docker info``
answers, else ``podman`` (Debian's, installed by ``make system-deps``).

The two CLIs take the same words for everything used here; where they differ
(build flags, health checks, ``rm``) the difference is in this file only.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.container.pipmounts import pip_mounts

CONTAINERS_CONF = Path(__file__).resolve().parent / "containers.conf"
INSTALL_HINT = (
    "run `make system-deps` (it installs podman, runc and debootstrap from Debian when "
    "no Docker engine answers), or start a Docker engine"
)


class EngineError(RuntimeError):
    """A CLI call that failed; the message holds the command and its output."""


@dataclass(frozen=True)
class Healthcheck:
    """A compose file's ``healthcheck``: ``test`` as compose writes it, durations as "5s"."""

    test: Sequence[str]
    interval: str = "30s"
    timeout: str = "30s"
    start_period: str = "0s"
    retries: int = 3

    def flags(self) -> list[str]:
        kind, *rest = self.test
        # Both CLIs take the command as one string, run by the image's shell:
        # podman 4.3 splits a JSON array at its spaces instead of reading it.
        command = shlex.join(rest) if kind == "CMD" else " ".join(rest)
        return [
            f"--health-cmd={command}",
            f"--health-interval={self.interval}",
            f"--health-timeout={self.timeout}",
            f"--health-start-period={self.start_period}",
            f"--health-retries={self.retries}",
        ]


@dataclass(frozen=True)
class Hardening:
    """How the chart and the compose file run every container."""

    read_only: bool = True
    tmpfs: Sequence[str] = ("/tmp",)
    cap_drop: Sequence[str] = ("ALL",)
    security_opt: Sequence[str] = ("no-new-privileges:true",)

    def flags(self) -> list[str]:
        flags = ["--read-only"] if self.read_only else []
        flags += [f"--tmpfs={path}" for path in self.tmpfs]
        flags += [f"--cap-drop={cap}" for cap in self.cap_drop]
        flags += [f"--security-opt={opt}" for opt in self.security_opt]
        return flags


@dataclass(frozen=True)
class Network:
    name: str
    aliases: Sequence[str] = ()


@dataclass(frozen=True)
class Engine:
    cli: str  # "docker" or "podman"
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    why: str = ""  # why this engine, for the test report

    @classmethod
    def find(cls) -> Engine:
        """docker when its daemon answers, else podman; EngineError saying how to get one."""
        docker_said = "the docker CLI is not installed"
        if shutil.which("docker"):
            result = _call(["docker", "info", "--format", "{{.ServerVersion}}"], os.environ, 30)
            if result.returncode == 0:
                return cls("docker", dict(os.environ), f"docker {result.stdout.strip()}")
            docker_said = "`docker info`: " + _last_line(result.stderr or result.stdout)
        if shutil.which("podman"):
            env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
            result = _call(["podman", "version", "--format", "{{.Client.Version}}"], env, 30)
            if result.returncode == 0:
                why = f"podman {result.stdout.strip()} ({docker_said})"
                return cls("podman", env, why)
            podman_said = "`podman version`: " + _last_line(result.stderr)
        else:
            podman_said = "podman is not installed"
        raise EngineError(
            f"no container engine answers ({docker_said}; {podman_said}): {INSTALL_HINT}"
        )

    @property
    def podman(self) -> bool:
        return self.cli == "podman"

    def call(
        self, *args: str, timeout_s: float = 120, check: bool = True, stdin: Any = None
    ) -> subprocess.CompletedProcess[str]:
        result = _call([self.cli, *args], self.env, timeout_s, stdin)
        if check and result.returncode != 0:
            raise EngineError(
                f"`{shlex.join([self.cli, *args])}` exited {result.returncode}:\n"
                f"{result.stdout[-6000:]}{result.stderr[-6000:]}"
            )
        return result

    # --- images ---------------------------------------------------------------

    def image_exists(self, image: str) -> bool:
        return self.call("image", "inspect", image, check=False).returncode == 0

    def image_labels(self, image: str) -> dict[str, str]:
        (found,) = json.loads(self.call("image", "inspect", image).stdout)
        labels: dict[str, str] = found["Config"].get("Labels") or {}
        return labels

    def image_healthcheck(self, image: str) -> list[str]:
        """The image's HEALTHCHECK test, as the engine stored it (["CMD", ...])."""
        (found,) = json.loads(self.call("image", "inspect", image).stdout)
        # docker keeps it in the image's Config; podman beside it.
        check = found["Config"].get("Healthcheck") or found.get("Healthcheck") or {}
        test: list[str] = check.get("Test") or []
        return test

    def image_env(self, image: str) -> dict[str, str]:
        """The image's ENV, as a process in it starts with."""
        (found,) = json.loads(self.call("image", "inspect", image).stdout)
        pairs = (entry.partition("=") for entry in found["Config"].get("Env") or [])
        return {name: value for name, _, value in pairs}

    def image_layers(self, image: str) -> list[tuple[str, str]]:
        """(the step that made it, its digest) for each of the image's layers, base first.

        The digest is the layer's diff ID (RootFS.Layers), the sha256 of its
        uncompressed tar: the same files make the same digest."""
        (found,) = json.loads(self.call("image", "inspect", image).stdout)
        digests: list[str] = found["RootFS"]["Layers"]
        if self.podman:
            # podman keeps the image's history, empty_layer flags included.
            steps = [
                entry.get("created_by", "")
                for entry in found.get("History") or []
                if not entry.get("empty_layer", False)
            ]
        else:
            # docker's inspect has no history: its CLI lists it newest first, and
            # BuildKit marks every step that changed no file as an empty layer (0 B).
            listed = self.call(
                "history",
                "--no-trunc",
                "--human=false",
                "--format",
                "{{.Size}}\t{{.CreatedBy}}",
                image,
            ).stdout.splitlines()
            sizes_steps = [line.partition("\t") for line in reversed(listed)]
            steps = [step for size, _, step in sizes_steps if size.strip() != "0"]
        if len(steps) != len(digests):
            raise EngineError(
                f"{image}: {len(digests)} layers but {len(steps)} steps that made one; "
                f"cannot tell which layer each step made:\n" + "\n".join(steps)
            )
        return list(zip(steps, digests, strict=True))

    def pull(self, image: str, timeout_s: float) -> str:
        """ "" when pulled, else why not."""
        try:
            result = self.call("pull", image, timeout_s=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return f"no answer from the registry in {timeout_s:g} s"
        return "" if result.returncode == 0 else _last_line(result.stderr, "error")

    def build(
        self,
        context: Path,
        tag: str,
        *,
        containerfile: Path | None = None,
        build_args: Mapping[str, str] | None = None,
        build_contexts: Mapping[str, str] | None = None,
        timeout_s: float = 1800,
    ) -> str:
        """Build ``context`` as ``tag``; returns the build's output (EngineError on failure).

        ``build_contexts`` maps a name the Dockerfile uses (an image its FROM
        names) to what replaces it (``docker-image://IMAGE``): docker (BuildKit)
        and podman (since 4.3) both take ``--build-context``."""
        args = ["build", "--tag", tag]
        if containerfile is not None:
            args += ["--file", str(containerfile)]
        for name, value in (build_args or {}).items():
            args += ["--build-arg", f"{name}={value}"]
        for name, value in (build_contexts or {}).items():
            args += ["--build-context", f"{name}={value}"]
        with tempfile.TemporaryDirectory(prefix="serving-build-") as tmp:
            if self.podman:
                # --format docker: the OCI format has no HEALTHCHECK. Host network:
                # the build reaches PyPI and Debian as this machine does, with its
                # pip settings (local wheels, indexes, CA bundle) mounted read-only.
                args += ["--format", "docker", "--network", "host"]
                for source, target in pip_mounts(Path(tmp)):
                    args += ["--volume", f"{source}:{target}:ro"]
            result = self.call(*args, str(context), timeout_s=timeout_s)
        return result.stdout + result.stderr

    def import_rootfs(self, rootfs: Path, tag: str, changes: Sequence[str] = ()) -> None:
        """A root filesystem folder as image ``tag`` (``docker import``)."""
        # The with block closes tar's pipe: left to the garbage collector, it is a
        # ResourceWarning, which the suite's filterwarnings turns into an error in
        # whichever test happens to run then (a fresh machine builds the stand-ins).
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            flags = [f"--change={change}" for change in changes]
            self.call("import", *flags, "-", tag, stdin=tar.stdout, timeout_s=600)

    def disk_usage(self) -> str:
        return self.call("system", "df").stdout

    # --- networks ---------------------------------------------------------------

    @contextmanager
    def network(self, name: str, *, internal: bool = False) -> Iterator[str]:
        self.call("network", "create", *(["--internal"] if internal else []), name)
        try:
            yield name
        finally:
            self.call("network", "rm", name, check=False)

    # --- containers -------------------------------------------------------------

    @contextmanager
    def container(
        self,
        image: str,
        name: str,
        *,
        env: Mapping[str, str] | None = None,
        networks: Sequence[Network] = (),
        publish: Sequence[int] = (),
        hardening: Hardening | None = None,
        healthcheck: Healthcheck | None = None,
        stop_timeout_s: int = 10,
    ) -> Iterator[str]:
        """A started container, removed when the block ends (its log printed if it raised)."""
        args = ["create", "--name", name, f"--stop-timeout={stop_timeout_s}"]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        if networks:
            args += ["--network", networks[0].name]
            args += [f"--network-alias={alias}" for alias in networks[0].aliases]
        # Published on 127.0.0.1 only, each on a free port the engine picks.
        args += [f"--publish=127.0.0.1::{port}" for port in publish]
        args += hardening.flags() if hardening else []
        args += healthcheck.flags() if healthcheck else []
        self.call(*args, image)
        try:
            for network in networks[1:]:
                aliases = [f"--alias={alias}" for alias in network.aliases]
                self.call("network", "connect", *aliases, network.name, name)
            self.call("start", name)
            yield name
        except BaseException:
            print(f"--- logs of {name} ---\n{self.logs(name)}", file=sys.stderr)
            raise
        finally:
            rm = ["rm", "--force"] + (["-t", "0"] if self.podman else [])
            self.call(*rm, name, check=False)

    def inspect(self, container: str) -> dict[str, Any]:
        (found,) = json.loads(self.call("container", "inspect", container).stdout)
        return dict(found)

    def running(self, container: str) -> bool:
        return bool(self.inspect(container)["State"]["Running"])

    def logs(self, container: str) -> str:
        result = self.call("logs", container, check=False)
        return result.stdout + result.stderr

    def exec(
        self, container: str, argv: Sequence[str], *, timeout_s: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` run in the container as its user; the caller reads the exit status."""
        return self.call("exec", container, *argv, timeout_s=timeout_s, check=False)

    def port(self, container: str, port: int) -> int:
        """The host port (on 127.0.0.1) published for the container's ``port``."""
        out = self.call("port", container, f"{port}/tcp").stdout.split()[0]
        return int(out.rpartition(":")[2])

    def stop(self, container: str, grace_s: int) -> int:
        """The image's STOPSIGNAL (SIGTERM unless it names another), SIGKILL after
        ``grace_s``; returns the exit code (137: it had to be killed)."""
        self.call("stop", "-t", str(grace_s), container, timeout_s=grace_s + 60)
        return int(self.inspect(container)["State"]["ExitCode"])

    def healthy(self, container: str) -> bool:
        """The container's health check, as the engine runs it."""
        if self.podman:
            # podman runs checks from systemd timers, which a container-based
            # machine lacks: run the check now, as a timer would.
            return self.call("healthcheck", "run", container, check=False).returncode == 0
        health = self.inspect(container)["State"].get("Health") or {}
        return bool(health.get("Status") == "healthy")

    def wait_healthy(self, container: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy(container):
            if not self.running(container):
                raise EngineError(f"{container} exited before it was healthy")
            if time.monotonic() > deadline:
                raise EngineError(f"{container} was not healthy within {timeout_s:g} s")
            time.sleep(1)


def _call(
    argv: list[str], env: Mapping[str, str], timeout_s: float, stdin: Any = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env=dict(env),
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )


def _last_line(text: str, default: str = "no output") -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else default
