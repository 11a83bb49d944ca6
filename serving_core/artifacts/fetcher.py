"""``fetch_model``: SERVING_MODEL_URI as a verified local directory, fetched once.

A local path is used in place. A store's URI is listed (cheap), and its
revision (a digest of the listing) names a folder in the cache: there already,
nothing is fetched; else its objects are streamed into a staging folder in
parallel ranged parts, checked, and renamed into place, all under the URI's
lock, so pods sharing one volume fetch once. Offline, the revision last fetched
is served without asking the store.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from serving_core.artifacts.failures import FetchError
from serving_core.artifacts.listing import Listing, list_uri, remote_scheme
from serving_core.artifacts.local import local_folder, walk_revision
from serving_core.artifacts.modelcache import ModelCache
from serving_core.artifacts.parts import PART_BYTES, WORKERS, Download
from serving_core.artifacts.verify import check

__all__ = ["FetchError", "Fetched", "fetch_model"]


@dataclass(frozen=True)
class Fetched:
    path: Path  # the verified directory the handler reads
    revision: str  # "sha256:" and 16 hex: a digest of the listing (or the local walk)
    fetched_bytes: int  # object bytes this call downloaded; 0 when all were cached
    files: int


def fetch_model(
    uri: str,
    cache: Path,
    offline: bool = False,
    *,
    workers: int = WORKERS,
    part_bytes: int = PART_BYTES,
) -> Fetched:
    """The directory holding ``uri``'s artifacts; raises ``FetchError`` (one line)."""
    if remote_scheme(uri) is None:
        folder = local_folder(uri)
        revision, files = walk_revision(folder)
        return Fetched(folder, revision, 0, files)
    model = ModelCache(cache, uri)
    if offline:
        return _offline(uri, cache, model)
    with model.locked():
        listing = list_uri(uri)
        revision = listing.revision
        if model.current() != revision and model.folder(revision).is_dir():
            model.point(revision)  # fetched before, then another revision since
        if model.current() == revision:
            return Fetched(model.folder(revision), revision, 0, len(listing.entries))
        fetched = _download(listing, model, workers, part_bytes)
        return Fetched(model.publish(revision), revision, fetched, len(listing.entries))


def _download(listing: Listing, model: ModelCache, workers: int, part_bytes: int) -> int:
    files, journals = model.staging(listing.revision)
    fetched = Download(listing, files, journals).run(workers, part_bytes)
    for entry in listing.entries:
        try:
            check(listing, entry, files / entry.path)
        except FetchError:
            # A bad file is never served, nor resumed from: the next fetch starts over.
            shutil.rmtree(files.parent, ignore_errors=True)
            raise
    return fetched


def _offline(uri: str, cache: Path, model: ModelCache) -> Fetched:
    revision = None
    if model.root.is_dir():
        # Shared: waits for a fetch of this URI under way (an init container's, a pod's).
        with model.locked(shared=True):
            revision = model.current()
    if revision is None:
        raise FetchError(
            uri,
            f"offline (SERVING_MODEL_OFFLINE) and no fetched copy in {cache}: run "
            "`serving-core fetch` with the store reachable first, or unset "
            "SERVING_MODEL_OFFLINE",
        )
    folder = model.folder(revision)
    files = sum(1 for path in folder.rglob("*") if path.is_file())
    return Fetched(folder, revision, 0, files)
