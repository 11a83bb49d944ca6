"""moto's S3 in server mode on 127.0.0.1, and a local folder uploaded to it.

Why moto: it is the suite's one S3 (the model fetcher's store, and the Kafka
broker's storage in tests/kafka_server.py), a real HTTP
server speaking S3's REST API with SigV4, ETags, ranged GETs, If-Match and, with
``INITIAL_NO_AUTH_ACTION_COUNT=0``, IAM's checks of every request. Every server
started here is stopped when its ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.servers import free_port, require_marker, stop, wait_port

REGION = "us-east-1"


@dataclass
class MotoS3:
    endpoint: str
    access_key_id: str = "AKIAMODELFETCHTEST"
    secret_access_key: str = "fetch-test-secret-never-shown"

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to reach it through obstore (and boto3)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def put(self, uri: str, body: bytes) -> None:
        """One object at ``s3://bucket/key``, its bucket made if need be."""
        bucket, key = _split(uri)
        client = self.client()
        self._bucket(client, bucket)
        client.put_object(Bucket=bucket, Key=key, Body=body)

    def upload(self, folder: Path, uri: str) -> None:
        """Every file under ``folder`` to ``s3://bucket/prefix/`` at its relative path."""
        bucket, prefix = _split(uri)
        client = self.client()
        self._bucket(client, bucket)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key = prefix.rstrip("/") + "/" + path.relative_to(folder).as_posix()
            client.upload_file(str(path), bucket, key.lstrip("/"))

    @staticmethod
    def _bucket(client: Any, bucket: str) -> None:
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=bucket)


def _split(uri: str) -> tuple[str, str]:
    assert uri.startswith("s3://"), uri
    bucket, _, key = uri[len("s3://") :].partition("/")
    return bucket, key


@contextlib.contextmanager
def moto_s3(*, auth: bool = False) -> Iterator[MotoS3]:
    """moto's S3 server on a free port; ``auth``: every request checked by IAM, so a
    key it never issued is denied (403)."""
    require_marker("e2e", "an S3 server (moto)")
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    env = {"PATH": "/usr/bin:/bin"}
    if auth:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    with tempfile.TemporaryDirectory(prefix="serving-s3-") as tmp:
        log_path = Path(tmp) / "moto.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(moto), "-H", "127.0.0.1", "-p", str(port)],
                cwd=tmp,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_port(process, port, log_path, "moto_server")
            yield MotoS3(f"http://127.0.0.1:{port}")
        finally:
            stop(process)
