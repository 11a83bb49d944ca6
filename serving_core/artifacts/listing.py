"""What a URI holds: its files' relative paths, sizes and ETags, its manifest, and the
revision they make, from one listing (or a manifest and a HEAD a file, for HTTP)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from serving_core.artifacts.failures import FetchError, from_store
from serving_core.artifacts.manifest import (
    MANIFEST,
    MAX_MANIFEST_BYTES,
    ManifestError,
    parse_manifest,
)
from serving_core.artifacts.stores import STORES, StoreKind, open_store

if TYPE_CHECKING:
    from obstore.store import ObjectStore


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the folder: where it lands in the fetched directory
    key: str  # the object's path in the store
    size: int
    etag: str | None


@dataclass(frozen=True)
class Listing:
    uri: str
    kind: StoreKind
    store: ObjectStore
    entries: list[Entry]
    digests: dict[str, str] = field(default_factory=dict)  # the manifest's, if any

    @property
    def revision(self) -> str:
        """A digest of the paths, sizes, ETags and manifest: a changed object changes it."""
        rows = [[e.path, e.size, e.etag] for e in self.entries]
        blob = json.dumps([rows, sorted(self.digests.items())]).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()[:16]


def remote_scheme(uri: str) -> str | None:
    """``uri``'s scheme when a store serves it, else None (a local path)."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme in STORES:
        return scheme
    return None


def list_uri(uri: str) -> Listing:
    """List ``uri``: a folder (it ends with ``/``, or a prefix holds objects) or one object."""
    scheme = urlsplit(uri).scheme.lower()
    kind = STORES[scheme]
    base = uri.split("?", 1)[0].split("#", 1)[0]
    folder, _, name = base.rstrip("/").rpartition("/")
    if base.endswith("/") or folder.endswith(":/"):  # a folder, or a bucket's root
        folder, name = base.rstrip("/"), ""
    if name and not kind.lists and urlsplit(uri).query:
        # A presigned or SAS URL: signed as a whole, query included, for GET alone.
        signed = open_store(uri, scheme)
        return Listing(uri, kind, signed, [_signed(signed, uri, kind, name)])
    store = open_store(folder, scheme)
    if name:
        single = _head(store, uri, kind, name)
        if single is not None:
            return Listing(uri, kind, store, [single])
        if not kind.lists:
            raise from_store(FileNotFoundError(name), uri, name, kind.credentials)
        store = open_store(f"{folder}/{name}", scheme)
    entries = _list(store, uri, kind) if kind.lists else _from_manifest(store, uri, kind)
    if not entries:
        raise FetchError(uri, "missing: the folder holds no objects; check the bucket and path")
    digests = _digests(store, uri, kind, entries)
    return Listing(uri, kind, store, entries, digests)


def _head(store: ObjectStore, uri: str, kind: StoreKind, name: str) -> Entry | None:
    import obstore

    try:
        meta = obstore.head(store, name)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise from_store(exc, uri, name, kind.credentials) from None
    return Entry(name, name, meta["size"], meta["e_tag"])


def _signed(store: ObjectStore, uri: str, kind: StoreKind, name: str) -> Entry:
    """A signed URL's object: its size from a one-byte GET, since the signature is for GET
    (a HEAD would be refused)."""
    import obstore

    try:
        meta = obstore.get(store, "", options={"range": (0, 1)}).meta
    except Exception as exc:
        raise from_store(exc, uri, name, kind.credentials) from None
    return Entry(name, "", meta["size"], meta["e_tag"])


def _list(store: ObjectStore, uri: str, kind: StoreKind) -> list[Entry]:
    import obstore

    try:
        metas = [meta for chunk in obstore.list(store) for meta in chunk]
    except Exception as exc:
        raise from_store(exc, uri, "", kind.credentials) from None
    # A key ending with / is a console's folder marker, not a file.
    entries = [
        Entry(m["path"], m["path"], m["size"], m["e_tag"])
        for m in metas
        if not m["path"].endswith("/")
    ]
    return sorted(entries, key=lambda e: e.path)


def _from_manifest(store: ObjectStore, uri: str, kind: StoreKind) -> list[Entry]:
    """An HTTP folder: the manifest names its files; a HEAD each gives size and ETag."""
    manifest = _head(store, uri, kind, MANIFEST)
    if manifest is None:
        raise FetchError(
            uri,
            f"an {kind.name} folder cannot be listed and has no {MANIFEST}: put a manifest "
            f"there (sha256sum FILES > {MANIFEST}), or name one file",
        )
    entries = [manifest]
    for path in sorted(_read_manifest(store, uri, kind, manifest)):
        entry = _head(store, uri, kind, path)
        if entry is None:
            raise FetchError(uri, f"missing: {MANIFEST} names {path!r}, which is not there")
        entries.append(entry)
    return sorted(entries, key=lambda e: e.path)


def _digests(store: ObjectStore, uri: str, kind: StoreKind, entries: list[Entry]) -> dict[str, str]:
    manifest = next((e for e in entries if e.path == MANIFEST), None)
    if manifest is None:
        return {}
    digests = _read_manifest(store, uri, kind, manifest)
    unnamed = sorted({e.path for e in entries} - set(digests) - {MANIFEST})
    if unnamed:
        raise FetchError(
            uri,
            f"{MANIFEST} does not name {unnamed[0]!r} ({len(unnamed)} files): add their "
            f"lines (sha256sum FILE >> {MANIFEST}) or remove them",
        )
    absent = sorted(set(digests) - {e.path for e in entries})
    if absent:
        raise FetchError(uri, f"missing: {MANIFEST} names {absent[0]!r}, which is not there")
    return digests


def _read_manifest(store: ObjectStore, uri: str, kind: StoreKind, entry: Entry) -> dict[str, str]:
    import obstore

    if entry.size > MAX_MANIFEST_BYTES:
        raise FetchError(uri, f"{MANIFEST} is over {MAX_MANIFEST_BYTES} bytes: is it one?")
    try:
        text = bytes(obstore.get(store, entry.key).bytes()).decode("utf-8", "replace")
    except Exception as exc:
        raise from_store(exc, uri, entry.key, kind.credentials) from None
    try:
        return parse_manifest(text)
    except ManifestError as exc:
        raise FetchError(uri, str(exc)) from None
