"""Asynchronous jobs: the queue interface, which every backend implements (the record,
``Job``, is ``jobs.job``'s, and importable from here).

``jobs.backends.open_queue(settings, queue)`` returns a :class:`JobQueue` for one handler's
jobs, on the backend that ``SERVING_JOBS_URL``'s scheme names: SQLite in WAL mode
when it is empty (one file shared by the gunicorn workers and ``serving-core
worker`` processes of one machine), or Redis Streams for a ``redis://``,
``rediss://`` or ``unix://`` URL (what Kubernetes deployments use). Every
backend gives the same guarantees:

- At-least-once delivery. ``take`` leases jobs to a consumer for
  ``jobs_lease_s``; a job not completed, failed or released by then (its
  consumer was killed) is handed out again. Each hand-out counts one attempt.
- A job completed twice (a slow consumer whose lease expired while another ran
  it too) keeps the first result: later ``complete`` calls change nothing.
- ``fail`` puts the job back for another attempt, or, once ``attempts`` has
  reached ``jobs_max_attempts``, ends it ``failed`` with its last error: a dead
  letter listed by ``dead_letters``. A job whose lease expires on its last
  attempt is failed the same way (``lease_expired``) instead of being handed
  out forever, so a job that kills every worker that runs it stops.
- A job cancelled while queued never runs. A running job cannot be cancelled.
- Finished jobs (done, failed, cancelled) and their results are readable for
  ``jobs_ttl_s``, then ``get`` answers None. Queued and running jobs never
  expire: the queue loses nothing it accepted.
- A job belongs to its ``owner`` (the caller's identity, ``""`` without API
  keys); the HTTP layer answers another caller as if the job did not exist.
- An idempotency key is the caller's own: it maps ``(owner, key)`` to its job
  for ``jobs_ttl_s`` after submission, as long as that job is still readable,
  and is bound to a digest of the parameters: the same key with other
  parameters raises ``KeyReused`` instead of answering the first job.
- Every store is bounded. ``jobs_max_queue`` caps unfinished jobs and
  ``jobs_max_stored`` every job held (unfinished, or finished and not yet
  expired); past either ``submit`` raises ``QueueFull``. With
  ``jobs_max_per_caller``, one owner holds at most that many unfinished jobs
  (``QuotaExceeded``). A finished job keeps its result or error, never its
  parameters.
- A queue knows whether anyone consumes it. ``take`` and ``renew`` leave the
  consumer's heartbeat in the store (at most every ``HEARTBEAT_S``), and
  ``consumers`` reads them back: without it, a job submitted while no
  ``serving-core worker`` takes from its queue (one started with another
  handler, or none at all) would stay ``queued`` forever with no sign why.

Why not a library. rq, huey, dramatiq, celery and arq were considered; none
gives all of the above *and* batched consumption, which is what a model
worker needs (take up to ``max_batch_size`` jobs, run them as one batch).
rq, huey and dramatiq hand a worker one job at a time; celery batches only
through the separate ``celery-batches`` task class, which buffers in the
worker's memory with acks tied to prefetch; arq is asyncio-only, which does
not fit gevent workers and a native model thread. Every one would also own the
worker process and its own retry and result stores, where serving-core needs a
queue it can drive from its own worker and HTTP layer. The layer here is thin:
Redis Streams consumer groups (XREADGROUP COUNT/BLOCK, XAUTOCLAIM for expired
leases, XACK) and one SQLite table.

Room for later backends: the interface speaks only of jobs, leases and
consumers. A Kafka or RabbitMQ backend would keep the job records (status,
result) in a store with a TTL and use the broker for delivery (RabbitMQ:
basic.get/prefetch with manual acks and a consumer timeout as the lease;
Kafka: a consumer group with committed offsets). A backend is a subpackage
(``jobs/sqlite/``, ``jobs/redis/``) whose ``backend`` module checks its URL and
its store and opens its queue, and one line of ``jobs.backends.BACKENDS`` gives
it its URL schemes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Re-exported: the record's users import it with the interface, from here.
from serving_core.jobs.job import FINISHED as FINISHED  # noqa: PLC0414
from serving_core.jobs.job import Job as Job  # noqa: PLC0414
from serving_core.jobs.job import JobStatus as JobStatus  # noqa: PLC0414
from serving_core.jobs.job import lease_expired_error as lease_expired_error  # noqa: PLC0414
from serving_core.jobs.job import new_job_id as new_job_id  # noqa: PLC0414
from serving_core.jobs.job import params_digest as params_digest  # noqa: PLC0414

# How often a consumer records that it polls a queue: its heartbeat. Taking (an
# idle consumer, once a second) and renewing leases (a long batch, every third
# of SERVING_JOBS_LEASE_S) both record it, so a live consumer is never quiet for
# a whole lease, which is how long one may be quiet before it counts as gone.
HEARTBEAT_S = 5.0

# The least Retry-After a refused submit is told, and all it is told when there is
# nothing to estimate from (jobs.drainrate): no job finished lately, or a per-key quota.
QUEUE_FULL_RETRY_AFTER_S = 1.0
MAX_STORED = "SERVING_JOBS_MAX_STORED"


@dataclass(frozen=True)
class Consumers:
    """A queue's consumers, as their heartbeats in the store tell."""

    live: int  # consumers heard from within the window asked for
    last_seen: float | None  # unix seconds of the latest heartbeat; None: none kept


class Heartbeat:
    """When each consumer of one queue object should next record its heartbeat."""

    def __init__(self, lease_s: float) -> None:
        # Several beats per lease, however short the lease is set.
        self.every_s = min(HEARTBEAT_S, lease_s / 3)
        self._next: dict[str, float] = {}

    def due(self, consumer: str, now: float) -> bool:
        if now < self._next.get(consumer, 0.0):
            return False
        self._next[consumer] = now + self.every_s
        return True


class QueueFull(Exception):
    """The queue holds ``jobs_max_queue`` unfinished jobs, or ``jobs_max_stored`` jobs in
    all (``setting`` says which); the client should retry after ``retry_after_s``, the
    store's estimate of when a place frees (``jobs.drainrate``)."""

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float = QUEUE_FULL_RETRY_AFTER_S,
        setting: str = "SERVING_JOBS_MAX_QUEUE",
    ) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.setting = setting


class QuotaExceeded(Exception):
    """The owner holds ``jobs_max_per_caller`` unfinished jobs; it should wait for them.

    Its ``retry_after_s`` stays the fixed 1 s: a place frees when one of the owner's
    own jobs finishes, which the queue's drain rate does not tell (its oldest may be
    running now or thousands deep), and the owner holds those jobs' ids to watch."""

    def __init__(self, message: str, *, retry_after_s: float = QUEUE_FULL_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KeyReused(Exception):
    """An idempotency key came back with other parameters than its job was made from."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"idempotency key reused with other parameters (job {job.id[:8]}...)")
        self.job = job


def quota_message(held: int, limit: int) -> str:
    return (
        f"this API key holds {held} unfinished jobs (SERVING_JOBS_MAX_PER_CALLER={limit}); "
        "wait for one to finish, or cancel one, then retry"
    )


class QueueUnavailable(Exception):
    """The backend could not answer (Redis unreachable, the SQLite file locked or unwritable).

    Its message reaches clients (a 503, a follow-up's ``job_error``): it names no
    host, port or path; where it is raised logs the detail."""


class StoreRefused(Exception):
    """A backend's start-up check refused its store: configured to drop jobs it accepted
    (an evicting Redis). The message names the store, masked, and the fix."""


class JobQueue(Protocol):
    """One handler's jobs. Every method is safe to call from any process sharing the queue."""

    queue: str  # its name: the handler's

    def submit(
        self,
        params: dict[str, Any],
        *,
        idempotency_key: str | None = None,
        owner: str = "",
        traceparent: str | None = None,
    ) -> Job:
        """Queue a job for ``owner``. Raises QueueFull or QuotaExceeded; the owner's
        repeated key returns the job it first made, or raises KeyReused when the
        parameters differ. ``traceparent`` (the submitter's span) is stored with it."""
        ...

    def get(self, job_id: str) -> Job | None:
        """The job, or None when unknown or expired."""
        ...

    def cancel(self, job_id: str) -> Job | None:
        """Cancel a queued job; a job past queued is left as it is. None when unknown."""
        ...

    def take(self, consumer: str, max_items: int, wait_s: float) -> list[Job]:
        """Lease up to ``max_items`` jobs to ``consumer``; wait up to ``wait_s`` for the first."""
        ...

    def complete(self, job: Job, result: Any) -> None:
        """Store the result, any JSON value (the first one stored wins), and finish the job."""
        ...

    def complete_many(self, finished: Sequence[tuple[Job, Any]]) -> None:
        """``complete`` for each (job, result) pair, in one transaction or round trip:
        a consumer stores its whole batch at once, not a commit per job."""
        ...

    def fail(self, job: Job, error: dict[str, Any], *, retry: bool = True) -> None:
        """This attempt failed: queue the job again, or dead-letter it after its last attempt.

        ``retry=False`` (the job itself is wrong, e.g. invalid input) fails it now.
        """
        ...

    def renew(self, consumer: str, jobs: Sequence[Job]) -> int:
        """Start the lease of ``consumer``'s jobs over (a long batch still running them),
        so that they are not handed out again meanwhile. Jobs no longer held under
        their lease are left alone; returns how many were renewed."""
        ...

    def release(self, jobs: Sequence[Job]) -> None:
        """Hand leased jobs back at once (shutdown), giving back the attempt they counted."""
        ...

    def dead_letters(self, limit: int = 100) -> list[Job]:
        """Failed jobs still within ``jobs_ttl_s``, the most recent first."""
        ...

    def depth(self) -> int:
        """Queued plus running jobs: the lag that metrics and autoscalers read."""
        ...

    def consumers(self, within_s: float) -> Consumers:
        """How many consumers took from (or renewed leases on) this queue within the
        last ``within_s`` seconds, and when one last did. Heartbeats older than
        ``jobs_ttl_s`` are forgotten."""
        ...

    def close(self) -> None: ...
