"""``/jobs`` and the time-lag follow-up, over this worker's job queues.

Its own queue (``SERVING_JOBS_ENABLED``: ``POST /jobs`` queues a request for
this handler's ``serving-core worker``) and the follow-up queue
(``SERVING_FOLLOWUP_QUEUE``: each answered ``/predict`` is queued for a slower
handler too). Both are opened in ``open``, after fork: neither a SQLite
connection nor a Redis pool may be shared by forked processes. Imports no Flask.

Traced, a submit is a ``job submit`` span (a producer's, under the request's
span) and the job keeps it as its ``traceparent``: the worker's ``job run``
span continues the submitter's trace.

A job belongs to its ``caller`` (``web.guard.caller_of`` the API key; ``""``
without keys): another caller's job answers the same 404 as an unknown one, so
a job id, even one that leaked, is no use to anyone else.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

from serving_core.engine.engine import Engine
from serving_core.errors import (
    Conflict,
    NotFound,
    NotReady,
    Overloaded,
    TooManyRequests,
    Unprocessable,
)
from serving_core.handler import Output, Params
from serving_core.jobs import liveness
from serving_core.jobs.backends import open_queue
from serving_core.jobs.base import (
    Job,
    JobQueue,
    KeyReused,
    QueueFull,
    QueueUnavailable,
    QuotaExceeded,
    params_digest,
)
from serving_core.settings import Settings
from serving_core.tracing.tracer import Span, tracer

log = logging.getLogger("serving_core.online.jobsapi")


def status_url(job_id: str) -> str:
    return f"/jobs/{job_id}"


class JobsApi:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.queue: JobQueue | None = None  # this handler's jobs
        self.followup: JobQueue | None = None

    def open(self) -> None:
        if self.settings.jobs_enabled:
            self.queue = open_queue(self.settings, self.engine.name)
        if self.settings.followup_queue:
            self.followup = open_queue(self.settings, self.settings.followup_queue)

    def close(self) -> None:
        for queue in self.queues:
            queue.close()

    @property
    def queues(self) -> list[JobQueue]:
        """The queues this worker has opened: its own jobs' and the follow-up one."""
        return [queue for queue in (self.queue, self.followup) if queue is not None]

    def submit(self, params: Params, *, idempotency_key: str | None, caller: str = "") -> Job:
        """Queue ``params`` for this handler's workers; a bad request is a 400 now, not a
        failed job later."""
        queue = self._own()
        self.engine.validate(params)
        try:
            with _submitting(queue) as span:
                job = queue.submit(
                    params,
                    idempotency_key=idempotency_key,
                    owner=caller,
                    traceparent=span.traceparent,
                )
                span.set("serving.job_id", job.id)
                return job
        except QueueFull as exc:
            raise Overloaded(
                f"the job queue is full ({exc.setting}); retry after the Retry-After delay",
                reason="jobs_full",
                retry_after_s=exc.retry_after_s,
            ) from None
        except QuotaExceeded as exc:
            raise TooManyRequests(str(exc), retry_after_s=exc.retry_after_s) from None
        except KeyReused:
            raise Unprocessable(
                "this Idempotency-Key was used with other parameters: a retry must send the "
                "same body; send a new key for a new job"
            ) from None
        except QueueUnavailable as exc:
            raise _unavailable(exc) from None

    def get(self, job_id: str, *, caller: str = "") -> Job:
        queues = self.queues
        if not queues:
            raise _not_open()
        for queue in queues:
            try:
                found = queue.get(job_id)
            except QueueUnavailable as exc:
                raise _unavailable(exc) from None
            if found is not None and found.owner == caller:
                return found
        raise NotFound(
            f"no job {job_id!r}: it never existed, or it finished more than "
            f"SERVING_JOBS_TTL_S={self.settings.jobs_ttl_s:g} s ago and its result expired"
        )

    def status(self, job_id: str, *, caller: str = "") -> dict[str, Any]:
        """``GET /jobs/<id>``: the job as its caller sees it, with how to get it run
        when no consumer polls its queue."""
        job = self.get(job_id, caller=caller)
        body = job.public()
        hint = self.hint(job)
        if hint is not None:
            body["hint"] = hint
        return body

    def exposition(self) -> bytes:
        """The queues' gauges for ``/metrics``, read from their store, not from the
        workers' metric files: whichever worker answers, they are the same."""
        return liveness.exposition(self.queues, self.settings.jobs_lease_s)

    def hint(self, job: Job) -> str | None:
        """For a queued job whose queue no consumer polls: how to get it run."""
        queue = self._queue_of(job)
        if job.status != "queued" or queue is None:
            return None
        handler = self.settings.handler if queue is self.queue else None
        return liveness.hint(queue, self.settings, handler=handler)

    def cancel(self, job_id: str, *, caller: str = "") -> Job:
        job = self.get(job_id, caller=caller)  # 404 for an unknown id or another's job
        queue = self._queue_of(job)
        if queue is None:
            raise _not_open()
        try:
            after = queue.cancel(job_id)
        except QueueUnavailable as exc:
            raise _unavailable(exc) from None
        if after is None:
            raise NotFound(f"no job {job_id!r}")
        if after.status != "cancelled":
            raise Conflict(f"job {job_id} is {after.status}: only a queued job can be cancelled")
        return after

    def follow_up(
        self, output: Output, params: Params, request_id: str, caller: str = ""
    ) -> Output:
        """``output``, with the id of the slow handler's job for the same request
        when there is a follow-up queue (the time-lag pattern).

        The job's idempotency key is the parameters' digest: a repeated request
        (every cache hit is one) gets the caller's job for the same parameters,
        queued or done within SERVING_JOBS_TTL_S, instead of a new one. The slow
        handler runs once per distinct request, not once per ``/predict``.
        """
        if self.followup is None:
            return output
        key = "followup-" + params_digest(params)
        try:
            with _submitting(self.followup) as span:
                job = self.followup.submit(
                    params, idempotency_key=key, owner=caller, traceparent=span.traceparent
                )
                span.set("serving.job_id", job.id)
        except (QueueFull, QuotaExceeded, QueueUnavailable) as exc:
            # The fast answer stands on its own; say why there is no slow one.
            log.warning("request %s: the follow-up was not queued: %s", request_id, exc)
            return {**output, "job_id": None, "job_error": f"not queued: {exc}"}
        return {**output, "job_id": job.id, "status_url": status_url(job.id)}

    def _queue_of(self, job: Job) -> JobQueue | None:
        return self.followup if job.queue != self.engine.name and self.followup else self.queue

    def _own(self) -> JobQueue:
        if self.queue is None:
            raise _not_open()
        return self.queue


def _submitting(queue: JobQueue) -> AbstractContextManager[Span]:
    """The ``job submit`` span, under the current (the request's) span: the job keeps it
    as its ``traceparent``. A refused submit ends it failed."""
    return tracer().span(
        "job submit",
        kind="producer",
        attributes={"messaging.system": "serving-core", "messaging.destination.name": queue.queue},
    )


def _not_open() -> NotReady:
    return NotReady("this worker has not opened its job queue yet; retry shortly")


def _unavailable(exc: QueueUnavailable) -> NotReady:
    return NotReady(f"the job queue is unavailable ({exc}); retry shortly")
