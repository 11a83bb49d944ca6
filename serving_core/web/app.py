"""The Flask-RESTful app: thin ``Resource`` adapters over ``Service``, one error funnel."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from random import getrandbits
from typing import Any

from flask import Flask, Request, Response, current_app, g, request, send_from_directory
from flask_restful import Api, Resource
from werkzeug.exceptions import HTTPException, NotFound, RequestEntityTooLarge

from serving_core import context, encoding
from serving_core.errors import QUOTE_CHARS, BadRequest, ServingError, quote, shorten
from serving_core.jobs import liveness
from serving_core.logs import BATCH_SIZE_KEY, ROUTE_KEY
from serving_core.metrics import CONTENT_TYPE, Metrics
from serving_core.online.jobsapi import status_url
from serving_core.online.service import Service
from serving_core.settings import Settings
from serving_core.web import access, arrival, docs, openapi
from serving_core.web.params import JsonLimits, request_params

log = logging.getLogger("serving_core.web.app")
_ROUTES_HINT = "SERVING_ROUTES_HINT"

REQUEST_ID = "X-Request-ID"
JSON = "application/json"
# A client-sent id is echoed into logs and headers: keep it short and printable.
_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
_HTTP_TYPES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


class ServingFlask(Flask):
    """Flask, asking once per function whether it is a coroutine function.

    Flask's ``ensure_sync`` asks ``inspect.iscoroutinefunction`` of each view and
    hook on every request (five on ``/predict``), and the answer for a
    registered function never changes. At most ``SYNC_CACHED`` functions are
    kept: one made per request (``after_this_request``) must not grow it.
    """

    SYNC_CACHED = 256

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sync: dict[Callable[..., Any], Callable[..., Any]] = {}

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        sync = self._sync.get(func)
        if sync is None:
            sync = super().ensure_sync(func)
            if len(self._sync) < self.SYNC_CACHED:
                self._sync[func] = sync
        return sync


def _this_request() -> Request:
    """The request object itself: every attribute read through ``flask.request``
    looks the request context up again, and ``/predict`` reads a dozen."""
    return request._get_current_object()  # type: ignore[attr-defined,no-any-return]


def create_app(settings: Settings, service: Service, metrics: Metrics) -> Flask:
    """The WSGI app: routes over ``service``, built by the caller (``server.serve``).

    Creating it starts nothing (gunicorn calls it in the master, before fork):
    ``service.start()`` starts the model thread, which the gunicorn
    ``post_fork`` hook does in each worker.
    """
    app = ServingFlask("serving_core")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["MAX_FORM_MEMORY_SIZE"] = settings.max_body_bytes
    # Flask's place for what an app serves; tests and tools find the service here.
    app.extensions["serving_core"] = service
    # Reads the keys file: a bad one stops the master here, before fork.
    guard = access.Guard(settings)
    described = guard.serves_private_paths
    app.config[_ROUTES_HINT] = "; see /openapi.json or /metadata for the API" if described else ""

    api = ErrorFunnelApi(app, catch_all_404s=True)
    api.representations = {"application/json": _json_response}
    limits = JsonLimits(settings.max_json_depth, settings.max_string_chars)
    # The hot path is a plain Flask view over the same Resource: Flask-RESTful's
    # dispatch (a Resource made per request, its output wrapper, content negotiation
    # over our one representation) adds work and nothing else here. Errors take the
    # same funnel either way (``error_response``).
    predict = Predict(service, limits, settings.max_body_bytes)
    app.add_url_rule("/predict", "predict", predict.view, methods=["POST"])
    if settings.jobs_enabled:
        api.add_resource(Jobs, "/jobs", resource_class_args=(service, limits))
    if settings.jobs_enabled or settings.followup_queue:
        api.add_resource(JobStatus, "/jobs/<job_id>", resource_class_args=(service,))
    api.add_resource(Healthz, "/healthz")
    api.add_resource(Readyz, "/readyz", resource_class_args=(service,))
    if described:
        api.add_resource(Metadata, "/metadata", resource_class_args=(service,))
        api.add_resource(MetricsEndpoint, "/metrics", resource_class_args=(metrics, service))
        document = openapi.document(
            service.name,
            service.handler.version,
            service.handler.input_schema,
            jobs=settings.jobs_enabled,
            example=service.loaded.sample,
        )
        api.add_resource(OpenAPI, "/openapi.json", resource_class_args=(document,))
    if settings.docs_enabled and described:
        # Plain routes, not Resources: HTML and static files, not JSON. When
        # serving-core has API keys, these go behind them like every route.
        _add_docs(app, docs.page(service.name))

    proxies = arrival.TrustedProxies(settings.trusted_proxies)
    app.before_request(lambda: _start_request(proxies))
    # After the request id is set: a 401 carries it too.
    app.before_request(guard.check)
    access.enable_cors(app, settings.cors_origins)
    app.after_request(_tag_response)

    @app.after_request
    def _count(response: Response) -> Response:
        req = _this_request()
        rule = req.url_rule
        # Unmatched paths share one label: a scanner must not create series.
        route = rule.rule if rule is not None else "unmatched"
        req.environ[ROUTE_KEY] = route  # for the JSON access line
        now = time.monotonic()
        metrics.request(route, response.status_code, now - g.get("arrival", now))
        return response

    # Errors outside Flask-RESTful's routes (unknown URLs, wrong methods) take the same funnel.
    app.register_error_handler(HTTPException, error_response)
    app.register_error_handler(Exception, error_response)
    return app


def _add_docs(app: Flask, html: str) -> None:
    assets = docs.assets_dir()

    @app.get("/docs")
    def docs_page() -> Response:
        return Response(html, mimetype="text/html")

    @app.get("/docs/<name>")
    def docs_asset(name: str) -> Response:
        if name not in docs.ASSETS:
            raise NotFound()
        return send_from_directory(assets, name, max_age=3600)


class ErrorFunnelApi(Api):  # type: ignore[misc]
    def handle_error(self, e: Exception) -> Response:
        return error_response(e)


class Predict(Resource):  # type: ignore[misc]
    def __init__(self, service: Service, limits: JsonLimits, max_body_bytes: int) -> None:
        self.service = service
        self.limits = limits
        self.max_body_bytes = max_body_bytes

    def post(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        req = _this_request()
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
        )
        environ[BATCH_SIZE_KEY] = context.take_batch_size()  # for the JSON access line
        return output, 200, {"X-Cache": served} if served else {}

    def view(self) -> Response:
        return _json_response(*self.post())


class Jobs(Resource):  # type: ignore[misc]
    def __init__(self, service: Service, limits: JsonLimits) -> None:
        self.service = service
        self.limits = limits

    def post(self) -> tuple[dict[str, Any], int, dict[str, str]]:
        params = request_params(request, self.limits)
        key = request.headers.get("Idempotency-Key")
        if key is not None and not _REQUEST_ID_OK.fullmatch(key):
            raise BadRequest(
                "Idempotency-Key must be 1-128 of A-Z a-z 0-9 . _ : / + = -; send e.g. a UUID"
            )
        job = self.service.jobs.submit(params, idempotency_key=key)
        url = status_url(job.id)
        return {"job_id": job.id, "status_url": url}, 202, {"Location": url}


class JobStatus(Resource):  # type: ignore[misc]
    def __init__(self, service: Service) -> None:
        self.service = service

    def get(self, job_id: str) -> dict[str, Any]:
        job = self.service.jobs.get(job_id)
        body = job.public()
        hint = self.service.jobs.hint(job)
        if hint is not None:
            body["hint"] = hint
        return body

    def delete(self, job_id: str) -> dict[str, Any]:
        return self.service.jobs.cancel(job_id).public()


class Healthz(Resource):  # type: ignore[misc]
    def get(self) -> dict[str, Any]:
        return {"status": "alive"}


class Readyz(Resource):  # type: ignore[misc]
    def __init__(self, service: Service) -> None:
        self.service = service

    def get(self) -> tuple[dict[str, Any], int]:
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


def _start_request(proxies: arrival.TrustedProxies) -> None:
    req = _this_request()
    headers = req.headers
    # A stamp from anyone else is ignored: the deadline counts from now.
    stamp = headers.get("X-Request-Start") if proxies.trusts(req.remote_addr) else None
    glob = g._get_current_object()
    glob.arrival = arrival.arrival(stamp, now=time.monotonic(), wall_now=time.time())
    sent = headers.get(REQUEST_ID, "")
    glob.request_id = sent if _REQUEST_ID_OK.fullmatch(sent) else new_request_id()


def new_request_id() -> str:
    """128 random bits as 32 hex digits, like ``uuid4().hex``.

    From ``random``'s generator, not ``os.urandom`` (a system call per
    request): an id names a request in logs and headers and guards nothing
    (job ids are ``uuid4``). ``random`` reseeds itself in every forked worker,
    so workers do not repeat each other's ids.
    """
    return f"{getrandbits(128):032x}"


def _tag_response(response: Response) -> Response:
    request_id = g.get("request_id")
    if request_id:
        response.headers[REQUEST_ID] = request_id
    return response


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


def _json_response(data: Any, code: int, headers: Any = None) -> Response:
    try:
        body = encoding.dumps(data)
    except TypeError as exc:
        request_id = g.get("request_id")
        log.error(
            "request %s: the handler's output is not JSON-serialisable: %s",
            request_id,
            exc,
            extra={"fields": {"request_id": request_id}},
        )
        return error_response(exc)
    # content_type, not mimetype: the same header (JSON takes no charset), without
    # werkzeug working it out for every response (4.4 -> 2.5 us a Response).
    response = Response(body, status=code, content_type=JSON)
    if headers:
        if type(headers) is dict:
            # One add per header: ``extend`` walks any mapping through a generic
            # multi-item iterator, half again the cost of building the response.
            add = response.headers.add
            for name, value in headers.items():
                add(name, value)
        else:
            response.headers.extend(headers)
    return response


def error_response(exc: Exception) -> Response:
    """Every error a request can end in, as ``{"error": {"type", "message"}}``."""
    request_id = g.get("request_id", "-")
    headers: dict[str, str] = {}
    if isinstance(exc, ServingError):
        status, body = exc.status, exc.body()
        headers.update(exc.headers)
        if exc.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    elif isinstance(exc, HTTPException):
        status = exc.code or 500
        body = {
            "error": {
                "type": _HTTP_TYPES.get(status, "http_error"),
                "message": _http_message(exc, status),
            }
        }
        allow = exc.get_response().headers.get("Allow") if status == 405 else None
        if allow:
            headers["Allow"] = allow
    else:
        log.exception(
            "request %s failed with an unexpected error",
            request_id,
            extra={"fields": {"request_id": request_id}},
        )
        status = 500
        body = {
            "error": {
                "type": "internal_error",
                "message": f"internal error; the server log has the details under "
                f"request id {request_id}",
            }
        }
    response = Response(encoding.dumps(body), status=status, content_type=JSON)
    response.headers.update(headers)
    if request_id != "-":
        response.headers[REQUEST_ID] = request_id
    return response


def _http_message(exc: HTTPException, status: int) -> str:
    if status == 404:
        path = shorten(request.path, QUOTE_CHARS)
        return f"no route {path}{current_app.config.get(_ROUTES_HINT, '')}"
    if status == 405:
        method, path = shorten(request.method, 16), shorten(request.path, QUOTE_CHARS)
        return f"{method} is not allowed on {path}"
    if status == 413:
        return "the request body is larger than SERVING_MAX_BODY_BYTES allows; send less"
    return exc.description or exc.name
