"""``serving-core fetch``: SERVING_MODEL_URI into SERVING_MODEL_CACHE, verified, before
anything loads it (the chart's init container runs it)."""

from __future__ import annotations

from pathlib import Path

from serving_core.artifacts.fetcher import FetchError, fetch_model
from serving_core.commands.failure import EXIT_PREDICT, Failure
from serving_core.settings import Settings
from serving_core.settings.secrets import masked


def main(settings: Settings) -> int:
    if not settings.model_uri:
        raise Failure(
            "SERVING_MODEL_URI is empty: set it to the model's folder (s3://bucket/prefix/, "
            "gs://, az://, https://host/path/ or an absolute path); see docs/artifacts.md"
        )
    try:
        fetched = fetch_model(
            settings.model_uri, Path(settings.model_cache), offline=settings.model_offline
        )
    except FetchError as exc:
        raise Failure(str(exc), EXIT_PREDICT) from None
    print(
        f"serving-core: fetched {masked(settings.model_uri)} revision {fetched.revision} "
        f"into {fetched.path}: {fetched.files} files, {fetched.fetched_bytes} bytes fetched",
        flush=True,
    )
    return 0
