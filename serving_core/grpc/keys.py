"""API keys on the gRPC front, as on HTTP (``web.guard``): with keys set, every call
but grpc.health.v1's needs one, as metadata ``authorization: Bearer <key>`` or
``x-api-key: <key>``; otherwise ``UNAUTHENTICATED``. The check itself is the HTTP
front's (``process.hooks`` hands in ``ApiKeys.allows``), so the two never differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

OPEN_PREFIX = "/grpc.health.v1.Health/"  # as /healthz and /readyz: probes carry no key
# What the API is: open with SERVING_PUBLIC_METADATA, as /metadata and /openapi.json.
DESCRIPTION_METHODS = frozenset(
    {
        "/inference.GRPCInferenceService/ServerMetadata",
        "/inference.GRPCInferenceService/ModelMetadata",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)
MESSAGE = "this API needs a key: send metadata authorization: Bearer <key> or x-api-key: <key>"


def presented(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    found = dict(metadata or ())
    scheme, _, token = str(found.get("authorization", "")).strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key = found.get("x-api-key")
    return str(key) if key else None


class KeyCheck(grpc.ServerInterceptor):  # type: ignore[misc]
    def __init__(
        self, allows: Callable[[str | None], bool], *, open_description: bool = False
    ) -> None:
        self.allows = allows
        self.open_description = open_description

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        method = details.method
        if (
            handler is None
            or method.startswith(OPEN_PREFIX)
            or (self.open_description and method in DESCRIPTION_METHODS)
            or self.allows(presented(details.invocation_metadata))
        ):
            return handler

        def refuse(request: Any, ctx: grpc.ServicerContext) -> Any:
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, MESSAGE)

        # A handler of the method's own kind: grpc calls it as it would the real one.
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)
