"""The stores the fetcher's tests read from: moto's S3 and nginx, one each a session.

``moto_s3`` (a ``MotoS3``: ``.upload(folder, "s3://bucket/prefix/")``, ``.put(uri,
body)``, ``.env`` for a process that reads it) is for any test that needs a model
in S3; its tests carry ``@pytest.mark.e2e``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.artifacts.http_server import StaticServer, static_nginx
from tests.s3_server import MotoS3
from tests.s3_server import moto_s3 as start_moto_s3


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    with start_moto_s3() as server:
        yield server


@pytest.fixture(scope="session")
def nginx_www() -> Iterator[StaticServer]:
    with static_nginx() as server:
        yield server
