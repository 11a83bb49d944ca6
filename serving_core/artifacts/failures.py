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


_PROBLEMS = {
    "missing": "missing: no object or bucket at {where} (HTTP 404); check the bucket, the "
    "path and its trailing slash (a folder ends with /)",
    "denied": "access denied reading {where} (HTTP {status}); give the credentials read and "
    "list access, or set them ({credentials}; see {docs})",
    "changed": "{where} changed while it was fetched (its ETag moved); run the fetch again "
    "once the upload is complete",
    "plain-http": "the store's endpoint is http://: set AWS_ALLOW_HTTP=true to allow it (or "
    "serve it over https)",
    "status": "the store answered HTTP {status} reading {where}; retry later",
    "unreachable": "unreachable: no answer from the store reading {where}; check the host, "
    "the endpoint (AWS_ENDPOINT_URL for an S3-compatible store) and the network",
    "other": "reading {where} failed ({error}); see {docs}",
}


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
    denied = isinstance(exc, PermissionDeniedError | UnauthenticatedError)
    checks = [
        ("missing", isinstance(exc, FileNotFoundError) or status == 404),
        ("denied", denied or status in (401, 403)),
        ("changed", isinstance(exc, PreconditionError) or status == 412),
        ("plain-http", "BadScheme" in text),
        ("status", status is not None),
        ("unreachable", "error sending request" in text or "timed out" in text.lower()),
    ]
    problem = next((name for name, hit in checks if hit), "other")
    return FetchError(
        uri,
        _PROBLEMS[problem].format(
            where=repr(path) if path else "the listing",
            status=status or 403,
            credentials=credentials,
            docs=DOCS,
            error=type(exc).__name__,
        ),
    )
