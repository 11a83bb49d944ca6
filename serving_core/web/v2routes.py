"""The Open Inference Protocol (V2) over REST, beside ``/predict``: thin Flask views
over ``v2.model.Model``; infer runs through the same front door, with
``Model.infer`` as its answer.

Errors take the app's one funnel, which gives any path under ``/v2`` V2's
``{"error": "..."}`` shape (``responses.error_response``). A body with an
``Inference-Header-Content-Length`` header is the binary tensor extension: that
many bytes of JSON, then the binary inputs; outputs asked for as binary data
come back the same way. Any other Content-Type than JSON, that extension's
``application/octet-stream`` or none is a 415, as on ``/predict``.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response

from serving_core import encoding
from serving_core.errors import BadRequest, UnsupportedMediaType, quote
from serving_core.online.door import Answered, FrontDoor
from serving_core.v2 import request as v2request
from serving_core.v2.model import Model, Outputs
from serving_core.v2.tensors import to_json, to_raw
from serving_core.web import headers
from serving_core.web.incoming import this_request
from serving_core.web.params import JsonLimits, json_object
from serving_core.web.responses import json_response

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY = "application/octet-stream"
TYPES = frozenset({"", "application/json", BINARY})
MODEL = "/v2/models/<name>"
VERSION = "/v2/models/<name>/versions/<version>"


def add_routes(app: Flask, model: Model, door: FrontDoor, limits: JsonLimits) -> None:
    def server_metadata() -> Response:
        return json_response(model.server_metadata(), 200)

    def live() -> Response:
        return json_response({"live": True}, 200)

    def ready() -> Response:
        # As /readyz: 503 while the model loads, a worker drains or its model thread is gone.
        is_ready = model.ready
        return json_response({"ready": is_ready}, 200 if is_ready else 503)

    def model_metadata(name: str, version: str | None = None) -> Response:
        model.find(name, version)
        return json_response(model.metadata(), 200)

    def model_ready(name: str, version: str | None = None) -> Response:
        model.find(name, version)
        is_ready = model.ready
        return json_response({"name": model.name, "ready": is_ready}, 200 if is_ready else 503)

    def infer(name: str, version: str | None = None) -> Response:
        model.find(name, version)
        req = this_request()
        _check_type(req.mimetype)

        def read() -> v2request.InferRequest:
            header, binary = _split(req.get_data(cache=False), req.headers.get(HEADER_LENGTH))
            return v2request.parse(json_object(header, limits), binary)

        parsed, answered = door.enter(headers.head(req), read, model.answer)
        return _response(model, parsed, answered, headers.answer_headers(req, door, answered))

    app.add_url_rule("/v2", "v2_server", server_metadata)
    # Both spellings are the OIP's server metadata; a redirect would lose a POSTing client.
    app.add_url_rule("/v2/", "v2_server_slash", server_metadata)
    app.add_url_rule("/v2/health/live", "v2_live", live)
    app.add_url_rule("/v2/health/ready", "v2_ready", ready)
    for path in (MODEL, VERSION):
        app.add_url_rule(path, f"v2_metadata{path}", model_metadata)
        app.add_url_rule(f"{path}/ready", f"v2_model_ready{path}", model_ready)
        app.add_url_rule(f"{path}/infer", f"v2_infer{path}", infer, methods=["POST"])


def _check_type(mimetype: str) -> None:
    """JSON (the OIP's), or the binary extension's octet-stream (KServe's client sends it
    with Inference-Header-Content-Length), or none (tritonclient sends none)."""
    if mimetype in TYPES or mimetype.endswith("+json"):
        return
    hint = (
        " (curl -d sends that unless told: add -H 'Content-Type: application/json')"
        if mimetype == "application/x-www-form-urlencoded"
        else ""
    )
    raise UnsupportedMediaType(
        f"unsupported Content-Type {quote(mimetype)}{hint}; send application/json, or "
        f"{BINARY} with {HEADER_LENGTH}"
    )


def _split(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON part and the binary part of a body."""
    if header_length is None:
        return body, b""
    digits = header_length.isascii() and header_length.isdigit() and len(header_length) < 20
    length = int(header_length) if digits else -1
    if not 0 <= length <= len(body):
        raise BadRequest(
            f"{HEADER_LENGTH}={quote(header_length)} is not the length of the JSON at the "
            f"start of the {len(body)}-byte body; send the JSON's size in bytes"
        )
    return body[:length], body[length:]


def _response(
    model: Model,
    parsed: v2request.InferRequest,
    answered: Answered[Outputs],
    headers: dict[str, str],
) -> Response:
    outputs: list[dict[str, Any]] = []
    raws: list[bytes] = []
    for name, datatype, array in answered.output:
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if parsed.all_binary or name in parsed.binary_outputs:
            raw = to_raw(array, datatype)
            entry["parameters"] = {"binary_data_size": len(raw)}
            raws.append(raw)
        else:
            entry["data"] = to_json(array, datatype)
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
    if parsed.id is not None:
        body["id"] = parsed.id
    body["outputs"] = outputs
    if not raws:
        return json_response(body, 200, headers)
    header = encoding.dumps(body)
    response = Response(header + b"".join(raws), status=200, content_type=BINARY)
    response.headers[HEADER_LENGTH] = str(len(header))
    response.headers.update(headers)
    return response
