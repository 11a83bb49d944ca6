"""OpenAI's completions API over REST (``serving_core.openai``), for a text generator:
``GET /v1/models`` (and ``/v1/models/<id>``), ``POST /v1/completions`` and
``POST /v1/chat/completions``, with ``stream: true`` or without, so that the
``openai`` client works unchanged against the server.

Both forms run the generation as a stream through the front door (its size
refusal, admission and deadlines): with ``stream: true`` each chunk goes out as
a ``data:`` event as it comes, then ``data: [DONE]``; without, the chunks are
collected into one answer that knows its ``finish_reason`` and its usage. An
error before the first chunk is an HTTP error in OpenAI's shape (the app's
funnel gives it every ``/v1`` path once these routes are served); one after it,
a last ``data: {"error": {...}}`` event, which the client raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from flask import Flask, Response

from serving_core.engine.stepper import End, Event, collect
from serving_core.generation import TextGeneration
from serving_core.online.door import FrontDoor, Head
from serving_core.online.streamed import Streamed
from serving_core.openai import asked, reply
from serving_core.openai.asked import Asked
from serving_core.openai.reply import Kind, Reply
from serving_core.web import headers, sse
from serving_core.web.incoming import this_request
from serving_core.web.params import JsonLimits, json_object
from serving_core.web.responses import OPENAI_ROUTES, json_response

DONE = b"data: [DONE]\n\n"


def add_routes(app: Flask, door: FrontDoor, text: TextGeneration, limits: JsonLimits) -> None:
    service = door.service
    name = service.name
    chat_prompt = service.handler.chat_prompt
    created = int(time.time())
    # The error funnel's word that /v1 paths are OpenAI's here.
    app.config[OPENAI_ROUTES] = True

    def parse(kind: Kind) -> Callable[[], Asked]:
        def read() -> Asked:
            body = json_object(this_request().get_data(cache=False), limits)
            if kind is Kind.CHAT:
                return asked.chat(body, name, text.prompt, chat_prompt)
            return asked.completion(body, name, text.prompt)

        return read

    def open_stream(request: Asked, head: Head) -> tuple[Asked, Streamed]:
        return request, door.open_stream(request.params, head)

    def serve(kind: Kind) -> Response:
        req = this_request()
        head = headers.head(req)
        request, streamed = door.enter(head, parse(kind), open_stream)
        answer = Reply(kind, name, head.request_id, text.text)
        if not request.stream:
            # Nothing is sent yet: an error of the generation is the response's.
            return json_response(answer.whole(*collect(streamed)), 200)

        def frames(event: Event, streamed: Streamed) -> bytes:
            objects = answer.events(event, streamed.chunks, request.include_usage)
            written = b"".join(sse.data(obj) for obj in objects)
            return written + DONE if isinstance(event, End) else written

        return sse.event_stream(streamed, frames)

    def models() -> Response:
        return json_response(reply.model_list(name, created), 200)

    def model(model_id: str) -> Response:
        asked.check_model(model_id, name)
        return json_response(reply.model_object(name, created), 200)

    def completions() -> Response:
        return serve(Kind.COMPLETION)

    def chat() -> Response:
        return serve(Kind.CHAT)

    app.add_url_rule("/v1/models", "openai_models", models)
    app.add_url_rule("/v1/models/<path:model_id>", "openai_model", model)
    app.add_url_rule("/v1/completions", "openai_completions", completions, methods=["POST"])
    app.add_url_rule("/v1/chat/completions", "openai_chat", chat, methods=["POST"])
