"""Server-sent events: a generation (``online.streamed.Streamed``) as ``text/event-stream``.

Each event goes out as soon as it exists: the response is a generator that
gunicorn writes chunk by chunk, and ``X-Accel-Buffering: no`` tells nginx not
to hold it. When the client hangs up, gunicorn's write fails and it closes the
generator, whose ``finally`` lets the generation go; the worker's watch on the
socket (``Service.stream``) notices a hang-up sooner, between two chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from flask import Request, Response

from serving_core import encoding
from serving_core.engine.stepper import Chunk, End, Event
from serving_core.online.streamed import Streamed

EVENT_STREAM = "text/event-stream"
# no-cache: an event stream is never replayed from a cache; X-Accel-Buffering: nginx
# passes each event on as it comes, whatever proxy_buffering says.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

# How a protocol writes one event of a generation (its SSE frames, as bytes).
Frames = Callable[[Event, Streamed], bytes]


def wants_stream(req: Request) -> bool:
    """Whether the client asked for an event stream (``Accept: text/event-stream``)."""
    return EVENT_STREAM in req.headers.get("Accept", "")


def event_stream(streamed: Streamed, frames: Frames, tail: bytes = b"") -> Response:
    """The response that sends ``streamed``'s events as ``frames`` writes them, then
    ``tail`` (OpenAI's ``data: [DONE]``)."""

    def body() -> Iterator[bytes]:
        try:
            for event in streamed:
                yield frames(event, streamed)
            if tail:
                yield tail
        finally:
            streamed.close()

    return Response(body(), content_type=EVENT_STREAM, headers=STREAM_HEADERS)


def data(payload: object, event: str | None = None, event_id: int | None = None) -> bytes:
    """One SSE frame of a JSON ``payload``."""
    head = b""
    if event is not None:
        head += b"event: " + event.encode() + b"\n"
    if event_id is not None:
        head += b"id: " + str(event_id).encode() + b"\n"
    return head + b"data: " + encoding.dumps(payload) + b"\n\n"


def predict_frames(event: Event, streamed: Streamed) -> bytes:
    """``/predict``'s events: each chunk as it is, then ``end`` with why, or ``error``
    with the JSON error body a request would have had."""
    if isinstance(event, Chunk):
        return data(event.output, event_id=streamed.chunks)
    if isinstance(event, End):
        return data({"finish_reason": event.reason, "chunks": streamed.chunks}, event="end")
    return data(event.body(), event="error")
