"""The routes: thin Flask-RESTful ``Resource`` adapters over ``Service``."""

from __future__ import annotations

import math
from typing import Any

from flask import Request, Response, g, request
from flask_restful import Resource
from werkzeug.exceptions import RequestEntityTooLarge

from serving_core import context
from serving_core.errors import BadRequest, quote
from serving_core.jobs import liveness
from serving_core.logs import BATCH_SIZE_KEY
from serving_core.metrics.core import CONTENT_TYPE, Metrics
from serving_core.online.jobsapi import status_url
from serving_core.online.service import Service
from serving_core.web.access import ApiKeys, caller
from serving_core.web.incoming import REQUEST_ID_OK, this_request
from serving_core.web.params import JsonLimits, request_params
from serving_core.web.responses import json_response


class Predict(Resource):  # type: ignore[misc]
    def __init__(self, service: Service, limits: JsonLimits, max_body_bytes: int) -> None:
        self.service = service
        self.limits = limits
        self.max_body_bytes = max_body_bytes

    def post(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        req = this_request()
        arrived = g.arrival
        timeout_s = _client_timeout(req)
        # From the headers alone, before the body is read: a full worker spends
        # nothing on a body it would refuse anyway.
        _refuse_oversized(req, self.max_body_bytes)
        self.service.admit(arrival=arrived, timeout_s=timeout_s)
        params = request_params(req, self.limits)
        context.take_batch_size()  # an earlier request on this greenlet may have left one
        environ = req.environ
        output, served = self.service.answer(
            params,
            request_id=g.request_id,
            arrival=arrived,
            timeout_s=timeout_s,
            # gunicorn's client socket: the worker watches it while the request waits.
            client=environ.get("gunicorn.socket"),
            caller=caller(),
        )
        environ[BATCH_SIZE_KEY] = context.take_batch_size()  # for the JSON access line
        # Off by default: a hit tells a client that someone sent these parameters.
        if served is None or not self.service.settings.cache_header:
            return output, 200, {}
        return output, 200, {"X-Cache": served}

    def view(self) -> Response:
        return json_response(*self.post())


class Jobs(Resource):  # type: ignore[misc]
    def __init__(self, service: Service, limits: JsonLimits) -> None:
        self.service = service
        self.limits = limits

    def post(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        params = request_params(request, self.limits)
        key = request.headers.get("Idempotency-Key")
        if key is not None and not REQUEST_ID_OK.fullmatch(key):
            raise BadRequest(
                "Idempotency-Key must be 1-128 of A-Z a-z 0-9 . _ : / + = -; send e.g. a UUID"
            )
        job = self.service.jobs.submit(params, idempotency_key=key, caller=caller())
        url = status_url(job.id)
        return {"job_id": job.id, "status_url": url}, 202, {"Location": url}


class JobStatus(Resource):  # type: ignore[misc]
    def __init__(self, service: Service) -> None:
        self.service = service

    def get(self, job_id: str) -> dict[str, Any]:
        job = self.service.jobs.get(job_id, caller=caller())
        body = job.public()
        hint = self.service.jobs.hint(job)
        if hint is not None:
            body["hint"] = hint
        return body

    def delete(self, job_id: str) -> dict[str, Any]:
        return self.service.jobs.cancel(job_id, caller=caller()).public()


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
    def __init__(self, metrics: Metrics, service: Service) -> None:
        self.metrics = metrics
        self.service = service

    def get(self) -> Response:
        # The job queues' gauges are read from their store now, not from the workers'
        # metric files: whichever worker answers, they are the same.
        queues = liveness.exposition(self.service.jobs.queues, self.service.settings.jobs_lease_s)
        return Response(self.metrics.exposition() + queues, content_type=CONTENT_TYPE)


def _refuse_oversized(req: Request, limit: int) -> None:
    # werkzeug would refuse it too, once the body is asked for: the client's fault
    # comes before the server's (a 413 before a 503). ``limit`` is the app's
    # MAX_CONTENT_LENGTH, passed in: the request looks it up through current_app.
    length = req.content_length
    if length is not None and length > limit:
        raise RequestEntityTooLarge()


def _client_timeout(req: Request) -> float | None:
    raw = req.headers.get("X-Request-Timeout")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise BadRequest(
            f"X-Request-Timeout={quote(raw)} is not a positive number of seconds; send e.g. 2.5"
        )
    return value
