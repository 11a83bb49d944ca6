"""A staged file checked before it is served: against the manifest's SHA-256 where there
is one, else the store's MD5 ETag (S3's single-part uploads), else its size."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from serving_core.artifacts.failures import FetchError
from serving_core.artifacts.manifest import MANIFEST

if TYPE_CHECKING:
    from serving_core.artifacts.listing import Entry, Listing

_MD5_ETAG = re.compile(r'^(?:W/)?"?([0-9a-f]{32})"?$')
_READ_BYTES = 1024 * 1024


def check(listing: Listing, entry: Entry, staged: Path) -> None:
    """Raise ``FetchError`` unless ``staged`` is ``entry``'s object, whole."""
    size = staged.stat().st_size
    if size != entry.size:
        raise FetchError(
            listing.uri, f"bad size: {entry.path!r} is {size} bytes, the store lists {entry.size}"
        )
    expected = listing.digests.get(entry.path)
    if expected is not None:
        _compare(
            listing, entry, staged, digest=hashlib.sha256(), expected=expected, source=MANIFEST
        )
        return
    found = _MD5_ETAG.match(entry.etag or "") if listing.kind.md5_etag else None
    if found is not None:
        md5 = hashlib.md5(usedforsecurity=False)
        # An SSE-KMS or SSE-C object's ETag is no MD5: only a manifest verifies those.
        source = f"its ETag (no MD5 if the bucket encrypts with KMS: add a {MANIFEST})"
        _compare(listing, entry, staged, digest=md5, expected=found[1], source=source)


def _compare(
    listing: Listing,
    entry: Entry,
    staged: Path,
    *,
    digest: hashlib._Hash,
    expected: str,
    source: str,
) -> None:
    with staged.open("rb") as read:
        while block := read.read(_READ_BYTES):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise FetchError(
            listing.uri,
            f"bad checksum: {entry.path!r} has {digest.name} {digest.hexdigest()[:16]}..., "
            f"{source} says {expected[:16]}...; upload the file (or {MANIFEST}) again",
        )
