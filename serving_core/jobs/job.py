"""A job as the queue stores it (``Job``), and what makes one: its id, its digest."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from serving_core import encoding

JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]
FINISHED: frozenset[JobStatus] = frozenset({"done", "failed", "cancelled"})  # never change again


def new_job_id() -> str:
    """128 random bits, URL-safe: unguessable, so a job id is its own capability."""
    return uuid.uuid4().hex


def params_digest(params: dict[str, Any]) -> str:
    """What an idempotency key is bound to: SHA-256 of the parameters, keys sorted."""
    return hashlib.sha256(encoding.dumps_sorted(params)).hexdigest()


def lease_expired_error(attempts: int) -> dict[str, Any]:
    return {
        "type": "lease_expired",
        "message": (
            f"the job's consumer did not finish it within its lease, {attempts} times "
            "(SERVING_JOBS_MAX_ATTEMPTS); a worker may be crashing on it or the lease "
            "(SERVING_JOBS_LEASE_S) is shorter than a batch takes"
        ),
    }


@dataclass(frozen=True)
class Job:
    """One job as the queue last stored it."""

    id: str
    queue: str  # the handler the job is for
    status: JobStatus
    params: dict[str, Any]  # {} once finished: a finished job keeps only its outcome
    attempts: int  # hand-outs to a consumer so far (a release gives one back)
    created_at: float  # unix seconds
    started_at: float | None  # when the latest attempt was handed out
    finished_at: float | None
    result: Any  # the handler's output, any JSON value; None until done
    error: dict[str, Any] | None  # {"type", "message"}; on a queued job, the last failure
    # Which hand-out this record came from (opaque, empty unless from take):
    # fail and release act only on the current lease, so a consumer whose lease
    # expired cannot fail or requeue a job another consumer now holds.
    lease: str = ""
    owner: str = ""  # who submitted it: a caller's identity, "" without API keys
    digest: str = ""  # params_digest of its parameters, which it drops once finished
    # The submitter's span as a W3C ``traceparent`` ("" untraced): the parent of the
    # span each run of the job is.
    traceparent: str = ""

    @classmethod
    def queued(
        cls,
        job_id: str,
        queue: str,
        params: dict[str, Any],
        now: float,
        *,
        owner: str,
        digest: str,
        traceparent: str = "",
    ) -> Job:
        """A job as ``submit`` just stored it."""
        return cls(
            job_id, queue, "queued", params, 0, now, None, None, None, None,
            owner=owner, digest=digest, traceparent=traceparent,
        )  # fmt: skip

    def public(self) -> dict[str, Any]:
        """What ``GET /jobs/<id>`` answers; timestamps are ISO-8601 UTC strings or null."""
        body: dict[str, Any] = {
            "job_id": self.id,
            "status": self.status,
            "attempts": self.attempts,
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }
        if self.status == "done":
            body["result"] = self.result
        if self.status == "failed" and self.error is not None:
            body["error"] = self.error
        return body


def _iso(unix_s: float | None) -> str | None:
    if unix_s is None:
        return None
    return datetime.fromtimestamp(unix_s, UTC).isoformat(timespec="milliseconds")
