"""One exchange, a request and its answer, as a CloudEvent (CloudEvents 1.0).

One event per exchange, not one for the request and another for the response
(KServe's logger sends two): a reader of the sink, a drift monitor or a shadow
comparison, gets what it compares in one record, with no join on the request
id across a stream that may have lost, or not yet received, one half. An
exchange that ends in an error has ``error`` where an answer has ``response``.

The event is in structured mode: the attributes and the data in one JSON
object (``application/cloudevents+json``), the same bytes over HTTP and in a
broker's message. Its extension attributes carry what a reader filters on:
``requestid``, ``modelname``, ``modelversion``, ``modelrevision`` (the model as
served, so that a canary's events tell apart from the stable release's) and
``traceparent`` (CloudEvents' distributed-tracing extension) when the request
was traced.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from serving_core import encoding
from serving_core.errors import ServingError
from serving_core.handler import Handler, Output, Params, handler_name, model_revision
from serving_core.payloads.redaction import Redaction

SPECVERSION = "1.0"
TYPE = "io.serving-core.inference"
CONTENT_TYPE = "application/cloudevents+json"
DATA_CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Origin:
    """The model the events are of: their ``source`` and the model's attributes."""

    name: str
    version: str
    revision: str  # ``handler.model_revision``: SERVING_MODEL_REVISION and the artifacts'

    @classmethod
    def of(cls, handler: Handler, build: str) -> Origin:
        return cls(handler_name(handler), handler.version, model_revision(handler, build))

    @property
    def source(self) -> str:
        return f"serving-core/{self.name}"


@dataclass(frozen=True, slots=True)
class Exchange:
    """What the request path records of one exchange; made into an event on the sender's
    thread, which is where the redaction and the encoding cost their time."""

    request_id: str
    params: Params
    output: Output | None
    error: ServingError | None
    time: float  # time.time() seconds, when the answer was known
    traceparent: str | None = None


def event(exchange: Exchange, origin: Origin, redaction: Redaction) -> dict[str, Any]:
    """The CloudEvent of ``exchange``, its id new (unique per event, as the spec asks)."""
    data: dict[str, Any] = {"request": redaction(exchange.params)}
    error = exchange.error
    if error is not None:
        data["error"] = {"status": error.status, "message": error.message}
    else:
        data["response"] = redaction(exchange.output)
    attributes: dict[str, Any] = {
        "specversion": SPECVERSION,
        "id": str(uuid.uuid4()),
        "source": origin.source,
        "type": TYPE,
        "time": _rfc3339(exchange.time),
        "datacontenttype": DATA_CONTENT_TYPE,
        "requestid": exchange.request_id,
        "modelname": origin.name,
        "modelversion": origin.version,
        "modelrevision": origin.revision,
    }
    if exchange.traceparent:
        attributes["traceparent"] = exchange.traceparent
    attributes["data"] = data
    return attributes


def encode(cloud_event: dict[str, Any]) -> bytes:
    """Structured mode's bytes; ``TypeError`` for data JSON cannot hold."""
    return encoding.dumps(cloud_event)


def _rfc3339(seconds: float) -> str:
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds")
    return stamp.replace("+00:00", "Z")
