"""A batch run's counts, and how they are shown while it runs."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

log = logging.getLogger("serving_core.batch.progress")

PROGRESS_EVERY_S = 10.0


@dataclass
class Counts:
    written: int = 0
    failed: int = 0
    skipped: int = 0  # already in the output
    skipped_failed: int = 0  # of those, written with an error by an earlier run
    duplicates: int = 0  # an id seen earlier in this input: not run again

    @property
    def seen(self) -> int:
        return self.written + self.skipped + self.duplicates


class Progress:
    """A tqdm bar (rate, ETA) on a terminal; a plain log line every 10 s otherwise."""

    def __init__(self, total: int | None, tty: bool) -> None:
        self._total = total
        self._started = time.monotonic()
        self._logged = self._started
        self._shown = 0
        self._bar: Any = None
        if tty:
            # No monitor thread: the workers fork while the bar exists.
            tqdm.monitor_interval = 0
            self._bar = tqdm(total=total, unit="rec", dynamic_ncols=True, file=sys.stderr)

    def update(self, tally: Counts) -> None:
        if self._bar is not None:
            self._bar.set_postfix(failed=tally.failed, refresh=False)
            self._bar.update(tally.seen - self._shown)
            self._shown = tally.seen
            return
        now = time.monotonic()
        if now - self._logged < PROGRESS_EVERY_S:
            return
        self._logged = now
        rate = tally.written / (now - self._started)
        if self._total:
            left = max(0, self._total - tally.seen)
            eta = f", ETA {left / rate:.0f} s" if rate > 0 else ""
            where = f"{tally.seen}/{self._total} ({100 * tally.seen / self._total:.0f}%)"
        else:
            eta, where = "", str(tally.seen)
        log.info("batch: %s records, %.1f/s, %d failed%s", where, rate, tally.failed, eta)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
