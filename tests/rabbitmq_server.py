"""Debian's real rabbitmq-server on 127.0.0.1, for the stream worker's tests.

Each server is a node of its own: free AMQP and distribution ports, its own
epmd on a free port (a machine's shared epmd, or the Debian service's node,
is never touched), its node name, Erlang cookie, data and logs in a temporary
directory. It is stopped (its process group, then its epmd) when its ``with``
block ends, whatever happens inside it, and ``restart`` runs it again on the
same port and data, so what durable queues held is there again.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import string
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.servers import free_port, require_marker, stop

# The script itself, not /usr/sbin's wrapper, which switches to the rabbitmq user.
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQCTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
EPMD = shutil.which("epmd") or "/usr/bin/epmd"
# AMQP 0-9-1's protocol header; a broker that is up answers it with Connection.Start,
# a method frame (type 1).
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


class RabbitMQServer:
    """One node; ``url`` is ``amqp://guest:guest@127.0.0.1:PORT/%2F``."""

    def __init__(self, tmp: Path, ready_timeout_s: float) -> None:
        self.port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"
        self.ready_timeout_s = ready_timeout_s
        self.log_path = tmp / "rabbitmq.log"
        self._epmd_port = free_port()
        home = tmp / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text("".join(secrets.choice(string.ascii_uppercase) for _ in range(20)))
        cookie.chmod(0o400)  # Erlang refuses a cookie others can read.
        (tmp / "enabled_plugins").write_text("[].\n")
        (tmp / "rabbitmq-env.conf").write_text("")
        (tmp / "rabbitmq.conf").write_text("")
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "ERL_EPMD_PORT": str(self._epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": f"serving-test-{secrets.token_hex(4)}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            # None of /etc/rabbitmq: a machine's own settings would change the tests.
            "RABBITMQ_CONF_ENV_FILE": str(tmp / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(tmp / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(tmp / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(tmp / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(tmp / "mnesia"),
            "RABBITMQ_LOG_BASE": str(tmp / "log"),
            "RABBITMQ_LOGS": "-",  # into the log file below, for the failure messages
            # Idle schedulers that busy-wait would take the cores the tests share.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "+sbwt none +sbwtdcpu none +sbwtdio none",
        }
        self._epmd: subprocess.Popen[bytes] | None = None
        self._broker: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if not Path(RABBITMQ_SERVER).exists():
            raise RuntimeError(f"{RABBITMQ_SERVER} is missing: `make system-deps` installs it")
        with self.log_path.open("ab") as log:
            if self._epmd is None:
                # In the foreground, so that it is ours to stop: the node would
                # otherwise start a daemon epmd that outlives it.
                self._epmd = subprocess.Popen(
                    [EPMD, "-port", str(self._epmd_port), "-address", "127.0.0.1"],
                    env=self._env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._broker = subprocess.Popen(
                [RABBITMQ_SERVER],
                env=self._env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready()

    def stop_broker(self) -> None:
        """The node only (its process group: the script, the VM and its helpers)."""
        if self._broker is not None:
            stop(self._broker, timeout_s=60.0)
            self._broker = None

    def restart(self) -> None:
        """Stop the node and start it again on the same port, name and data."""
        self.stop_broker()
        self.start()

    def close(self) -> None:
        try:
            self.stop_broker()
        finally:
            if self._epmd is not None:
                stop(self._epmd)
                self._epmd = None

    def process_groups(self) -> list[int]:
        """The node's and epmd's process groups, for a test that they are gone."""
        return [p.pid for p in (self._broker, self._epmd) if p is not None]

    def eval(self, expression: str) -> str:
        """An Erlang expression run on the node (``rabbitmqctl eval``): a setting changed
        while it runs, for one test."""
        done = subprocess.run(
            [RABBITMQCTL, "-n", self._env["RABBITMQ_NODENAME"], "eval", expression],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_ready(self) -> None:
        assert self._broker is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._broker.poll() is not None:
                raise RuntimeError(
                    f"rabbitmq-server exited with {self._broker.returncode}:\n" + self.output()
                )
            if _answers_amqp(self.port):
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"rabbitmq-server not ready after {self.ready_timeout_s} s:\n" + self.output()
        )


def _answers_amqp(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as sock:
        sock.settimeout(5)
        sock.sendall(PROTOCOL_HEADER)
        return sock.recv(1) == b"\x01"
    return False


@contextlib.contextmanager
def rabbitmq_server(*, ready_timeout_s: float = 120.0) -> Iterator[RabbitMQServer]:
    """Run rabbitmq-server on free ports; yields it once it accepts AMQP connections."""
    require_marker("e2e", "rabbitmq-server")
    with tempfile.TemporaryDirectory(prefix="serving-rabbitmq-") as tmp:
        server = RabbitMQServer(Path(tmp), ready_timeout_s)
        try:
            server.start()
            yield server
        finally:
            server.close()
