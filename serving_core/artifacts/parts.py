"""An object streamed to disk in ranged parts, in parallel, resumably.

Each object is one file in the staging folder, written in place by its parts
(``os.pwrite`` at the part's offset), never held whole in memory: a part is
streamed in chunks. A part's index is appended to the file's journal once its
bytes are on disk, so a fetch killed midway starts again from the parts the
journal names. The staging folder belongs to one revision (``ModelCache``), and
each ranged GET asks for the listed ETag (``If-Match``), so a changed object is
fetched again from nothing rather than stitched from two versions.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from serving_core.artifacts.failures import FetchError, from_store

if TYPE_CHECKING:
    from serving_core.artifacts.listing import Entry, Listing

PART_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 1024 * 1024
WORKERS = 4


@dataclass(frozen=True)
class Part:
    entry: Entry
    index: int
    start: int
    end: int  # exclusive


def parts_of(entry: Entry, part_bytes: int = PART_BYTES) -> list[Part]:
    starts = range(0, entry.size, part_bytes)
    return [Part(entry, i, s, min(s + part_bytes, entry.size)) for i, s in enumerate(starts)]


class Journal:
    """The parts of one staged file whose bytes are on disk, one index a line."""

    def __init__(self, folder: Path, entry: Entry) -> None:
        name = hashlib.sha256(entry.path.encode()).hexdigest()[:24]
        self.path = folder / f"{name}.parts"

    def done(self) -> set[int]:
        if not self.path.exists():
            return set()
        # A line cut short by a kill has no newline: that part is fetched again.
        lines = self.path.read_text().split("\n")[:-1]
        return {int(line) for line in lines if line.isdigit()}

    def record(self, index: int) -> None:
        # O_APPEND: each line lands whole at the end, whichever thread writes it.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"{index}\n".encode())
        finally:
            os.close(fd)


class Download:
    """Every entry of ``listing`` into ``files`` (journals in ``journals``)."""

    def __init__(self, listing: Listing, files: Path, journals: Path) -> None:
        self.listing = listing
        self.files = files
        self.journals = journals
        self.fetched_bytes = 0
        self._count = threading.Lock()
        self._stop = threading.Event()

    def run(self, workers: int = WORKERS, part_bytes: int = PART_BYTES) -> int:
        """Fetch what is not on disk yet; returns the bytes fetched."""
        pending: list[Part] = []
        for entry in self.listing.entries:
            target = self.files / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("ab") as staged:
                if os.fstat(staged.fileno()).st_size != entry.size:
                    staged.truncate(entry.size)
            done = Journal(self.journals, entry).done()
            pending += [p for p in parts_of(entry, part_bytes) if p.index not in done]
        if not pending:
            return 0
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fetch") as pool:
            futures = [pool.submit(self._fetch, part) for part in pending]
            finished, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in finished if f.exception() is not None]
            if failed:
                self._stop.set()  # the other parts stop at their next chunk
                failed[0].result()
        return self.fetched_bytes

    def _fetch(self, part: Part) -> None:
        import obstore

        entry = part.entry
        options: dict[str, object] = {"range": (part.start, part.end)}
        if entry.etag:
            options["if_match"] = entry.etag
        offset = part.start
        fd = os.open(self.files / entry.path, os.O_WRONLY)
        try:
            result = obstore.get(self.listing.store, entry.key, options=options)  # type: ignore[arg-type]
            for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                if self._stop.is_set():
                    return
                os.pwrite(fd, chunk, offset)
                offset += len(chunk)
                with self._count:
                    self.fetched_bytes += len(chunk)
            if offset != part.end:
                raise FetchError(
                    self.listing.uri,
                    f"{entry.path!r} ended at byte {offset}, not {part.end}: it changed while "
                    "it was fetched; run the fetch again",
                )
            os.fdatasync(fd)
        except FetchError:
            raise
        except Exception as exc:
            raise from_store(
                exc, self.listing.uri, entry.key, self.listing.kind.credentials
            ) from None
        finally:
            os.close(fd)
        Journal(self.journals, entry).record(part.index)
