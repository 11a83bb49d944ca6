"""An access line for each ``ModelInfer`` call, as gunicorn writes one per HTTP request.

It goes through the ``gunicorn.access`` logger (by name: this package imports no
gunicorn), so it lands where the HTTP lines do, in the same format: text
(``SERVING_LOG_FORMAT=text``) with the request line a gRPC call is on the wire,

    127.0.0.1 "POST /inference.GRPCInferenceService/ModelInfer HTTP/2" 200 - 9ms
        request_id=3f2a... grpc_status=OK      (one line)

or JSON with the HTTP line's fields (``route``, ``status``, ``batch_size``…) plus
``protocol`` and ``grpc_status``. ``status`` is the HTTP status of the outcome,
as the metrics count it, so one query covers every front.
"""

from __future__ import annotations

import logging

ACCESS = logging.getLogger("gunicorn.access")
_FORMAT = '%s "POST %s HTTP/2" %s - %dms request_id=%s grpc_status=%s'


def remote_addr(peer: str) -> str:
    """``ipv4:127.0.0.1:5000`` or ``ipv6:[::1]:5000`` (grpc's ``peer()``) as an address."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer or "-"
    host = rest.rpartition(":")[0]
    return host.strip("[]") or "-"


def log_call(
    *,
    peer: str,
    route: str,
    status: int,
    grpc_status: str,
    duration_s: float,
    request_id: str,
    batch_size: int | None,
    trace_id: str | None = None,
) -> None:
    if not ACCESS.isEnabledFor(logging.INFO):
        return
    address = remote_addr(peer)
    fields = {
        "request_id": request_id,
        "method": "POST",
        "path": route,
        "route": route,
        "batch_size": batch_size,
        "status": status,
        "grpc_status": grpc_status,
        "protocol": "grpc",
        "duration_ms": round(duration_s * 1000, 3),
        "remote_addr": address,
        "trace_id": trace_id,
    }
    args: tuple[object, ...] = (address, route, status, int(duration_s * 1000), request_id)
    args += (grpc_status, trace_id) if trace_id else (grpc_status,)
    # Not ACCESS.info(): that walks the stack for a file and line no format uses.
    record = ACCESS.makeRecord(
        ACCESS.name,
        logging.INFO,
        "(unknown file)",
        0,
        _FORMAT + " trace_id=%s" if trace_id else _FORMAT,
        args,
        None,
        extra={"fields": fields},
    )
    ACCESS.handle(record)
