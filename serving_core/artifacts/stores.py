"""SERVING_MODEL_URI's schemes: each store obstore opens for one, and what it can do.

A store is a table line here (``STORES``), never an if-chain of schemes elsewhere.
obstore reads each store's credentials from the environment itself (``AWS_*``,
``GOOGLE_*``, ``AZURE_*``, and the IRSA and Workload Identity token files).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig


@dataclass(frozen=True)
class StoreKind:
    name: str
    lists: bool  # can list a prefix; an HTTP server cannot, so a folder needs its manifest
    md5_etag: bool  # a single-part upload's ETag is the object's MD5
    credentials: str  # where the credentials come from, for a denied read's message


S3 = StoreKind(
    "S3",
    lists=True,
    md5_etag=True,
    credentials="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or IRSA's AWS_ROLE_ARN",
)
GCS = StoreKind(
    "GCS",
    lists=True,
    md5_etag=False,
    credentials="GOOGLE_APPLICATION_CREDENTIALS, or Workload Identity",
)
AZURE = StoreKind(
    "Azure",
    lists=True,
    md5_etag=False,
    credentials="AZURE_STORAGE_ACCOUNT_KEY or AZURE_CLIENT_ID and its secret, or Workload Identity",
)
HTTP = StoreKind(
    "HTTP", lists=False, md5_etag=False, credentials="a presigned URL, or a server that allows it"
)

STORES: dict[str, StoreKind] = {
    "s3": S3,
    "s3a": S3,
    "gs": GCS,
    "az": AZURE,
    "azure": AZURE,
    "abfs": AZURE,
    "abfss": AZURE,
    "adl": AZURE,
    "http": HTTP,
    "https": HTTP,
}
# A plain absolute path or file:///: used in place, never copied (baked-in weights).
LOCAL_SCHEMES = ("", "file")

# Fail fast on a store that does not answer (obstore's default retries for 3 minutes).
_RETRY: RetryConfig = {
    "max_retries": 2,
    "retry_timeout": timedelta(seconds=20),
    "backoff": {
        "init_backoff": timedelta(milliseconds=100),
        "max_backoff": timedelta(seconds=2),
        "base": 2,
    },
}


def open_store(folder: str, scheme: str) -> ObjectStore:
    """The obstore store whose root is ``folder`` (a URL without its trailing slash)."""
    from obstore.store import HTTPStore, from_url

    if STORES[scheme] is not HTTP:
        # The cloud stores take their client options from the environment (AWS_ALLOW_HTTP
        # for an http:// S3 endpoint); options passed here would replace them all.
        return from_url(folder, retry_config=_RETRY)
    # HTTPStore itself, never from_url's guess from the host: a presigned amazonaws.com
    # or SAS blob.core.windows.net URL is fetched as it is signed, with no credentials
    # added. An http:// URI is the user's explicit choice, and a part on a slow link
    # may take longer than obstore's default 30 s.
    client: ClientConfig = {
        "allow_http": scheme == "http",
        "connect_timeout": "10s",
        "timeout": "30m",
    }
    return HTTPStore.from_url(folder, client_options=client, retry_config=_RETRY)
