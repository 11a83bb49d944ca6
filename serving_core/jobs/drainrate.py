"""The ``Retry-After`` a full queue answers: when a place will free up, from how fast
the queue's workers have been finishing jobs.

A place under ``jobs_max_queue`` frees when an unfinished job finishes (done,
failed or cancelled), so a refused submit is told ``needed / rate``: ``needed``
jobs must finish (one, or the excess when the cap was lowered below the
depth), at the rate jobs finished over the last ``DRAIN_WINDOW_S``. The
workers finish jobs in other processes, often on other machines, so the rate
comes from the store: the finished jobs it already keeps until they expire,
counted by expiry (SQLite's ``jobs_queue_expiry`` index, Redis's ``finished``
sorted set). A job's expiry is its finish plus ``SERVING_JOBS_TTL_S``, so a
finish within the window is an expiry past ``now - window + ttl``; this holds
while the API and its workers share ``SERVING_JOBS_TTL_S``, as they share the
queue's other settings. The count runs only on a refusal, and stops at the
number that already makes the answer the 1 s floor, so it reads at most
``needed * window_s`` index entries (``COUNT_MAX``) however fast the queue drains.

Nothing finished within the window (no worker, or one stuck on a long batch)
leaves nothing to go by: the answer is the 1 s floor. The rate is the
window's average, not the latest burst: workers finish whole batches at once.
"""

from __future__ import annotations

import math

from serving_core.jobs.base import QUEUE_FULL_RETRY_AFTER_S

DRAIN_WINDOW_S = 60.0  # how far back finished jobs count towards the rate
# However slow the drain, a client is asked back within a minute: the estimate
# is an average, and a worker that just started changes it at once.
RETRY_AFTER_MAX_S = 60.0
COUNT_MAX = 10_000  # index entries a refusal reads at most (SQLite; Redis's ZCOUNT is O(log n))


def window_s(ttl_s: float) -> float:
    """The window the store can answer for: a job finished longer than ``ttl_s`` ago
    has expired (SQLite may keep its row until the purge; the count skips it)."""
    return min(DRAIN_WINDOW_S, ttl_s)


def expired_after(now: float, ttl_s: float) -> float:
    """The expiry past which a finished job finished within the window."""
    return now - window_s(ttl_s) + ttl_s


def count_limit(needed: int, ttl_s: float) -> int:
    """Finished jobs worth counting: at this many the answer is already the floor. A cap
    lowered far below the depth (a large ``needed``) stops at ``COUNT_MAX``, erring long."""
    floor = math.ceil(needed * window_s(ttl_s) / QUEUE_FULL_RETRY_AFTER_S)
    return max(1, min(COUNT_MAX, floor))


def queue_full_retry_after(needed: int, finished: int, ttl_s: float) -> float:
    """Seconds until ``needed`` jobs finish, at the rate of ``finished`` jobs per window."""
    if finished <= 0:
        return QUEUE_FULL_RETRY_AFTER_S  # nothing finished lately: nothing to go by
    estimate = needed * window_s(ttl_s) / finished
    return min(RETRY_AFTER_MAX_S, max(QUEUE_FULL_RETRY_AFTER_S, estimate))


def store_full_retry_after(oldest_expiry: float | None, now: float) -> float:
    """How long until the next finished job expires and frees a place (at least 1 s)."""
    if oldest_expiry is None:
        return QUEUE_FULL_RETRY_AFTER_S  # all unfinished: a place frees as workers finish
    return max(QUEUE_FULL_RETRY_AFTER_S, oldest_expiry - now)
