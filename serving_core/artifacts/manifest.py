"""The manifest: ``SHA256SUMS`` beside the files, in ``sha256sum``'s format.

``cd model && sha256sum $(find . -type f ! -name SHA256SUMS | sed 's|^\\./||') > SHA256SUMS``
writes one. Each line is a SHA-256 in hex, two spaces (or a space and ``*``), and
a path relative to the manifest's folder. With one, every file is checked against
it; an HTTP folder, which cannot be listed, needs one to say what it holds.
"""

from __future__ import annotations

import re

MANIFEST = "SHA256SUMS"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_LINE = re.compile(r"^(?P<digest>[0-9a-fA-F]{64}) [ *](?P<path>.+)$")


class ManifestError(ValueError):
    """A manifest line ``sha256sum`` would not have written."""


def parse_manifest(text: str) -> dict[str, str]:
    """Each relative path to its SHA-256 (lower-case hex)."""
    digests: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        found = _LINE.match(line)
        if found is None:
            raise ManifestError(
                f"{MANIFEST} line {number} is not 'SHA256  PATH' (write it with sha256sum)"
            )
        path = found["path"].removeprefix("./")
        if path.startswith("/") or ".." in path.split("/"):
            raise ManifestError(f"{MANIFEST} line {number}: {path!r} is not inside the folder")
        digests[path] = found["digest"].lower()
    return digests
