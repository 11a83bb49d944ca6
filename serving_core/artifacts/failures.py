"""How a fetch fails: one line naming the URI without its credentials, what went wrong
and how to fix it; and the translation of a store's error into that line."""

from __future__ import annotations

import re

from serving_core.settings.secrets import masked

DOCS = "docs/artifacts.md#the-stores"
_STATUS = re.compile(r"status code: (\d{3})")


class FetchError(Exception):
    """A fetch stopped; ``str(exc)`` is one line that says what to fix."""

    def __init__(self, uri: str, problem: str) -> None:
        super().__init__(f"SERVING_MODEL_URI={masked(uri)}: {problem}")


def from_store(exc: Exception, uri: str, path: str, credentials: str) -> FetchError:
    """``exc``, raised by obstore while reading ``path``, as a ``FetchError``.

    The store's own text is never shown: it may hold a presigned URL or a
    header. Only its HTTP status and the kind of failure are.
    """
    # Imported here, not at the top: a local URI, used in place, never loads obstore.
    from obstore.exceptions import (
        PermissionDeniedError,
        PreconditionError,
        UnauthenticatedError,
    )

    text = str(exc)
    found = _STATUS.search(text)
    status = int(found[1]) if found else None
    where = f"{path!r}" if path else "the listing"
    if isinstance(exc, FileNotFoundError) or status == 404:
        return FetchError(
            uri,
            f"missing: no object or bucket at {where} (HTTP 404); check the bucket, the path "
            "and its trailing slash (a folder ends with /)",
        )
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError) or status in (401, 403):
        return FetchError(
            uri,
            f"access denied reading {where} (HTTP {status or 403}); give the credentials "
            f"read and list access, or set them ({credentials}; see {DOCS})",
        )
    if isinstance(exc, PreconditionError) or status == 412:
        return FetchError(
            uri,
            f"{where} changed while it was fetched (its ETag moved); run the fetch again "
            "once the upload is complete",
        )
    if status is not None:
        return FetchError(uri, f"the store answered HTTP {status} reading {where}; retry later")
    if "error sending request" in text or "timed out" in text.lower() or "connect" in text:
        return FetchError(
            uri,
            f"unreachable: no answer from the store reading {where}; check the host, the "
            "endpoint (AWS_ENDPOINT_URL for an S3-compatible store) and the network",
        )
    return FetchError(uri, f"reading {where} failed ({type(exc).__name__}); see {DOCS}")
