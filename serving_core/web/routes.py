"""The routes: thin Flask-RESTful ``Resource`` adapters over the front door, the job
queues' API and ``Service``."""

from __future__ import annotations

from typing import Any

from flask import Response, request
from flask_restful import Resource

from serving_core.context import REQUEST_ID_OK
from serving_core.errors import BadRequest
from serving_core.metrics.metrics import CONTENT_TYPE, Metrics
from serving_core.online.door import FrontDoor
from serving_core.online.jobsapi import JobsApi, status_url
from serving_core.online.service import Service
from serving_core.web import headers, sse
from serving_core.web.guard import ApiKeys, caller
from serving_core.web.incoming import this_request
from serving_core.web.params import JsonLimits, request_params
from serving_core.web.responses import json_response


class Predict(Resource):  # type: ignore[misc]
    def __init__(self, door: FrontDoor, limits: JsonLimits) -> None:
        self.door = door
        self.limits = limits

    def post(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        req = this_request()
        answered = self.door.predict(headers.head(req), lambda: request_params(req, self.limits))
        return answered.output, 200, headers.answer_headers(req, self.door, answered)

    def view(self) -> Response:
        req = this_request()
        if self.door.service.generates and sse.wants_stream(req):
            streamed = self.door.stream(headers.head(req), lambda: request_params(req, self.limits))
            return sse.event_stream(streamed, sse.predict_frames)
        return json_response(*self.post())


class Jobs(Resource):  # type: ignore[misc]
    def __init__(self, jobs: JobsApi, limits: JsonLimits) -> None:
        self.jobs = jobs
        self.limits = limits

    def post(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        params = request_params(request, self.limits)
        key = request.headers.get("Idempotency-Key")
        if key is not None and not REQUEST_ID_OK.fullmatch(key):
            raise BadRequest(
                "Idempotency-Key must be 1-128 of A-Z a-z 0-9 . _ : / + = -; send e.g. a UUID"
            )
        job = self.jobs.submit(params, idempotency_key=key, caller=caller())
        url = status_url(job.id)
        return {"job_id": job.id, "status_url": url}, 202, {"Location": url}


class JobStatus(Resource):  # type: ignore[misc]
    def __init__(self, jobs: JobsApi) -> None:
        self.jobs = jobs

    def get(self, job_id: str) -> dict[str, Any]:
        return self.jobs.status(job_id, caller=caller())

    def delete(self, job_id: str) -> dict[str, Any]:
        return self.jobs.cancel(job_id, caller=caller()).public()


class Healthz(Resource):  # type: ignore[misc]
    def get(self) -> dict[str, Any]:
        return {"status": "alive"}


class Readyz(Resource):  # type: ignore[misc]
    def __init__(self, service: Service, keys: ApiKeys) -> None:
        self.service = service
        self.keys = keys

    def get(self) -> tuple[dict[str, Any], int]:
        # A broken keys file fails closed (its bad lines pass no one): say so here,
        # where the rollout and the alerts look, not only in the log.
        self.keys.refresh()
        if self.keys.fault is not None:
            return {
                "status": "not ready",
                "reason": f"SERVING_API_KEYS_FILE {self.keys.fault}",
            }, 503
        if self.service.ready:
            return {"status": "ready"}, 200
        return {"status": "not ready"}, 503


class Metadata(Resource):  # type: ignore[misc]
    def __init__(self, service: Service) -> None:
        self.service = service

    def get(self) -> dict[str, Any]:
        return self.service.metadata()


class OpenAPI(Resource):  # type: ignore[misc]
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def get(self) -> dict[str, Any]:
        return self.document


class MetricsEndpoint(Resource):  # type: ignore[misc]
    def __init__(self, metrics: Metrics, jobs: JobsApi) -> None:
        self.metrics = metrics
        self.jobs = jobs

    def get(self) -> Response:
        exposition = self.metrics.exposition() + self.jobs.exposition()
        return Response(exposition, content_type=CONTENT_TYPE)
