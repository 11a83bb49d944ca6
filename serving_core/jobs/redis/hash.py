"""The Redis queue's job hash (``job:ID``), read back as a ``Job``.

Values are strings: timestamps are unix seconds as ``repr(float)``, params,
result and error are JSON, and an empty string stands for None.
"""

from __future__ import annotations

from typing import Any, cast

from serving_core import encoding
from serving_core.jobs.base import Job, JobStatus


def flat(fields: dict[str, str]) -> list[str]:
    """HGETALL's dict as the field, value, … list a script returns."""
    return [item for pair in fields.items() for item in pair]


def job_of(pairs: list[str], queue: str) -> Job:
    """The job a hash's field, value, … list describes, in ``queue``."""
    fields = dict(zip(pairs[::2], pairs[1::2], strict=True))

    def optional_float(name: str) -> float | None:
        value = fields.get(name, "")
        return float(value) if value else None

    def optional_json(name: str) -> Any:
        value = fields.get(name, "")
        return encoding.loads(value) if value else None

    return Job(
        id=fields["id"],
        queue=queue,
        status=cast(JobStatus, fields["status"]),
        params=optional_json("params") or {},  # a finished job has none
        attempts=int(fields["attempts"]),
        created_at=float(fields["created_at"]),
        started_at=optional_float("started_at"),
        finished_at=optional_float("finished_at"),
        result=optional_json("result"),
        error=optional_json("error"),
        lease=fields.get("lease", ""),
        owner=fields.get("owner", ""),
        digest=fields.get("digest", ""),
        traceparent=fields.get("traceparent", ""),
    )
