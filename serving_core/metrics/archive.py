"""A dead worker's counters and histograms, folded into one archive file per kind."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("serving_core.metrics.archive")

# The files a dead worker leaves whose values add up across processes. (Gauges:
# ours are all live*: ``mark_process_dead`` removes them, and
# ``directory.worker_exited`` calls it first.)
SUMMED_KINDS = ("counter", "histogram", "summary")


def archive_dead_worker(directory: Path, pid: int) -> None:
    """Add a dead worker's counters and histograms into ``KIND_archive.db`` and remove
    its files: a worker recycled every N requests would otherwise leave two files
    per generation, which every scrape reads, without end.

    The new archive is written aside and renamed into place, then the dead file is
    removed: a scrape between the two (two system calls) counts it twice.
    """
    from prometheus_client.mmap_dict import MmapedDict

    for kind in SUMMED_KINDS:
        dead = directory / f"{kind}_{pid}.db"
        if not dead.exists():
            continue
        archive = directory / f"{kind}_archive.db"
        fresh = directory / f"{kind}_archive.db.new"  # not *.db: no scrape reads it
        try:
            totals: dict[str, float] = {}
            for source in (archive, dead):
                if source.exists():
                    read = MmapedDict.read_all_values_from_file
                    for key, value, _ts, _pos in read(str(source)):  # type: ignore[no-untyped-call]
                        totals[key] = totals.get(key, 0.0) + value
            fresh.unlink(missing_ok=True)
            merged = MmapedDict(str(fresh))  # type: ignore[no-untyped-call]
            try:
                for key, value in totals.items():
                    merged.write_value(key, value, 0.0)  # type: ignore[no-untyped-call]
            finally:
                merged.close()  # type: ignore[no-untyped-call]
            os.replace(fresh, archive)
            dead.unlink()
        except OSError as exc:
            log.warning(
                "could not fold worker %d's %s metrics into %s: %s", pid, kind, archive, exc
            )
