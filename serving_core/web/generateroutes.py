"""V2's generate extension over REST (``v2.generate``), for a text generator:
``/v2/models/<name>[/versions/<version>]/generate`` answers the collected text as
one JSON object, through the front door's ``answer`` (the cache included);
``.../generate_stream`` sends each chunk as an SSE ``data`` event as it comes.

An error before the first chunk is an HTTP error, V2's ``{"error": "..."}`` (the
app's funnel gives every ``/v2`` path that shape); one after it is the stream's
last event, the same object.
"""

from __future__ import annotations

from flask import Flask, Response

from serving_core.engine.stepper import Chunk, End, Event
from serving_core.generation import TextGeneration
from serving_core.handler import Params
from serving_core.online.door import FrontDoor
from serving_core.online.streamed import Streamed
from serving_core.v2.generate import TextGenerate
from serving_core.v2.model import Model
from serving_core.web import headers, sse
from serving_core.web.incoming import this_request
from serving_core.web.params import JsonLimits, json_object
from serving_core.web.responses import json_response
from serving_core.web.v2routes import MODEL, VERSION


def add_routes(
    app: Flask, model: Model, door: FrontDoor, text: TextGeneration, limits: JsonLimits
) -> None:
    generate = TextGenerate(model, text)

    def read() -> Params:
        return generate.params(json_object(this_request().get_data(cache=False), limits))

    def frames(event: Event, streamed: Streamed) -> bytes:
        if isinstance(event, Chunk):
            return sse.data(generate.answer(event.output))
        if isinstance(event, End):
            return sse.data(generate.end(event.reason))
        return sse.data(generate.error(event))

    def one(name: str, version: str | None = None) -> Response:
        model.find(name, version)
        req = this_request()
        answered = door.enter(headers.head(req), read, door.answer)
        return json_response(
            generate.answer(answered.output), 200, headers.answer_headers(req, door, answered)
        )

    def stream(name: str, version: str | None = None) -> Response:
        model.find(name, version)
        return sse.event_stream(door.stream(headers.head(this_request()), read), frames)

    for path in (MODEL, VERSION):
        app.add_url_rule(f"{path}/generate", f"v2_generate{path}", one, methods=["POST"])
        app.add_url_rule(
            f"{path}/generate_stream", f"v2_generate_stream{path}", stream, methods=["POST"]
        )
