"""The Flask app: the routes (``routes``, ``v2routes``) over the front door and
``Service``, the request hooks and one error funnel (``responses``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, Request, Response, current_app, g, send_from_directory
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from serving_core.metrics.metrics import Metrics
from serving_core.online.door import FrontDoor
from serving_core.online.service import Service
from serving_core.pipeline.pipeline import Pipeline
from serving_core.settings import Settings
from serving_core.v2.model import Model
from serving_core.web import (
    arrival,
    docs,
    generateopenapi,
    generateroutes,
    guard,
    incoming,
    openaiopenapi,
    openairoutes,
    openapi,
    openapirules,
    v2openapi,
    v2routes,
)
from serving_core.web.logfields import ROUTE_KEY
from serving_core.web.params import JsonLimits
from serving_core.web.responses import (
    JSON,
    ROUTES_HINT,
    ErrorFunnelApi,
    error_response,
    is_openai,
    is_v2,
    json_response,
)
from serving_core.web.routes import (
    Healthz,
    Jobs,
    JobStatus,
    Metadata,
    MetricsEndpoint,
    OpenAPI,
    Predict,
    Readyz,
)
from serving_core.web.traced import Traced


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


def create_app(settings: Settings, service: Service, metrics: Metrics) -> Flask:
    """The WSGI app: routes over ``service``, built by the caller (``process.server.build``).

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
    # The gRPC front checks the same keys (``process.hooks``).
    app.extensions[guard.EXTENSION] = keys_guard = guard.Guard(settings, metrics.keys_file)
    if isinstance(service.handler, Pipeline):
        service.handler.check_callers(
            keys=bool(keys_guard.keys), allowed=settings.pipeline_without_keys
        )
    described = keys_guard.serves_private_paths
    app.config[ROUTES_HINT] = "; see /openapi.json or /metadata for the API" if described else ""

    api = ErrorFunnelApi(app, catch_all_404s=True)
    api.representations = {JSON: json_response}
    limits = JsonLimits(settings.max_json_depth, settings.max_string_chars)
    # The hot path is a plain Flask view over the same Resource: Flask-RESTful's
    # dispatch (a Resource made per request, its output wrapper, content negotiation
    # over our one representation) adds work and nothing else here. Errors take the
    # same funnel either way (``error_response``).
    door = FrontDoor(service)
    predict = Predict(door, limits)
    app.add_url_rule("/predict", "predict", predict.view, methods=["POST"])
    v2model = Model(door)
    v2routes.add_routes(app, v2model, door, limits)
    describe_text = _add_text_routes(app, v2model, door, limits)
    if settings.jobs_enabled:
        api.add_resource(Jobs, "/jobs", resource_class_args=(service.jobs, limits))
    if settings.jobs_enabled or settings.followup_queue:
        api.add_resource(JobStatus, "/jobs/<job_id>", resource_class_args=(service.jobs,))
    api.add_resource(Healthz, "/healthz")
    api.add_resource(Readyz, "/readyz", resource_class_args=(service, keys_guard.keys))
    if described:
        api.add_resource(Metadata, "/metadata", resource_class_args=(service,))
        api.add_resource(MetricsEndpoint, "/metrics", resource_class_args=(metrics, service.jobs))
        document = _document(settings, service, v2model, keys_guard, describe_text)
        api.add_resource(OpenAPI, "/openapi.json", resource_class_args=(document,))
    if settings.docs_enabled and described:
        # Plain routes, not Resources: HTML and static files, not JSON. When
        # serving-core has API keys, these go behind them like every route.
        _add_docs(app, docs.page(service.name))

    proxies = arrival.TrustedProxies(settings.trusted_proxies)
    app.before_request(lambda: incoming.start(proxies))
    # After the request id is set: a 401 carries it too.
    app.before_request(keys_guard.check)
    app.before_request(lambda: incoming.bound_chunked(settings.max_body_bytes))
    guard.enable_cors(app, settings.cors_origins, cache_header=settings.cache_header)
    app.after_request(incoming.tag)

    @app.after_request
    def _count(response: Response) -> Response:
        req = incoming.this_request()
        rule = req.url_rule
        route = rule.rule if rule is not None else _unmatched_route(req)
        req.environ[ROUTE_KEY] = route  # for the JSON access line
        now = time.monotonic()
        protocol = "v2" if is_v2(req.path) else "openai" if is_openai(req.path) else "predict"
        metrics.request(route, response.status_code, now - g.get("arrival", now), protocol)
        return response

    # Errors outside Flask-RESTful's routes (unknown URLs, wrong methods) take the same funnel.
    app.register_error_handler(HTTPException, error_response)
    app.register_error_handler(Exception, error_response)
    return _traced(app)


def _document(
    settings: Settings,
    service: Service,
    model: Model,
    keys_guard: guard.Guard,
    describe_text: Callable[[dict[str, Any], openapi.Bounds], None],
) -> dict[str, Any]:
    """``/openapi.json``'s document: every route served, the server's limits on their
    requests, and with API keys, which routes need one."""
    bounds = openapi.Bounds(
        settings.max_body_bytes,
        settings.max_string_chars,
        settings.max_json_depth,
        settings.max_tokens if service.generates else None,
    )
    document = openapi.document(
        service.name,
        service.handler.version,
        service.handler.input_schema,
        jobs=settings.jobs_enabled,
        example=service.loaded.sample,
        bounds=bounds,
    )
    v2openapi.extend(document, model, service.loaded.sample, bounds, settings.max_queue)
    describe_text(document, bounds)
    if keys_guard.keys:
        opened = guard.OPEN_PATHS | keys_guard.public
        if "/metadata" in keys_guard.public:  # SERVING_PUBLIC_METADATA: V2's too
            opened |= {p for p in document["paths"] if guard.V2_DESCRIPTION.fullmatch(p)}
        openapirules.secure(document, opened)
    return document


def _traced(app: Flask) -> Flask:
    # Outermost, so the request's span holds every hook and route (SERVING_TRACES).
    app.wsgi_app = Traced(app.wsgi_app)  # type: ignore[method-assign]
    return app


def _add_text_routes(
    app: Flask, model: Model, door: FrontDoor, limits: JsonLimits
) -> Callable[[dict[str, Any], openapi.Bounds], None]:
    """A text generator's own fronts, V2's generate extension and OpenAI's API; what
    adds their paths to the OpenAPI document. Any other handler's app has neither."""
    service = door.service
    text = service.handler.text if service.generates else None
    if text is None:
        return lambda document, bounds: None
    generateroutes.add_routes(app, model, door, text, limits)
    openairoutes.add_routes(app, door, text, limits)

    def describe(document: dict[str, Any], bounds: openapi.Bounds) -> None:
        generateopenapi.extend(document, model, bounds)
        openaiopenapi.extend(document, service.name, bounds)

    return describe


def _unmatched_route(req: Request) -> str:
    """The label of a request that no rule took. A wrong method (405) names the route
    whose path it matched; every other path shares "unmatched" (the 404s: a scanner
    must not create series)."""
    refused = req.routing_exception
    if isinstance(refused, MethodNotAllowed) and refused.valid_methods:
        adapter = current_app.create_url_adapter(req)
        if adapter is not None:
            with contextlib.suppress(HTTPException):
                method = next(iter(refused.valid_methods))
                rule, _ = adapter.match(method=method, return_rule=True)
                return rule.rule
    return "unmatched"


def _add_docs(app: Flask, html: str) -> None:
    assets = docs.assets_dir()

    @app.get("/docs")
    def docs_page() -> Response:
        return Response(html, mimetype="text/html")

    @app.get("/docs/")
    def docs_slash() -> Response:
        # Relative, as every URL on the page is: it works under a proxy's prefix too.
        return Response(status=308, headers={"Location": "../docs"})

    @app.get("/docs/<name>")
    def docs_asset(name: str) -> Response:
        if name not in docs.ASSETS:
            raise NotFound()
        return send_from_directory(assets, name, max_age=3600)
