"""The Flask side of the front door (``online.door``), for every route that runs a
request through it (``routes.Predict``, ``v2routes``' infer):

- ``head``: what the request says before its body is read: its id and arrival
  (``incoming``), its own timeout (``X-Request-Timeout``), its length, its
  caller (``guard``) and gunicorn's client socket;
- ``answer_headers``: what an answer leaves behind: the batch size, in the
  environ for the access line (``logfields``), and ``X-Cache`` when the door
  says the client may know.
"""

from __future__ import annotations

import math
from typing import Any

from flask import Request, g

from serving_core.errors import BadRequest, quote
from serving_core.online.door import Answered, FrontDoor, Head
from serving_core.web.guard import caller
from serving_core.web.logfields import BATCH_SIZE_KEY

TIMEOUT_HEADER = "X-Request-Timeout"


def head(req: Request) -> Head:
    glob = g._get_current_object()
    return Head(
        request_id=glob.request_id,
        arrival=glob.arrival,
        timeout_s=client_timeout(req),
        content_length=req.content_length,
        caller=caller(),
        # gunicorn's client socket: the worker watches it while the request waits.
        client=req.environ.get("gunicorn.socket"),
    )


def client_timeout(req: Request) -> float | None:
    raw = req.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise BadRequest(
            f"{TIMEOUT_HEADER}={quote(raw)} is not a positive number of seconds; send e.g. 2.5"
        )
    return value


def answer_headers(req: Request, door: FrontDoor, answered: Answered[Any]) -> dict[str, str]:
    """The headers ``answered`` adds to its response; its batch size is left for the
    access line."""
    req.environ[BATCH_SIZE_KEY] = answered.batch_size
    served = door.cache_header(answered)
    return {"X-Cache": served} if served is not None else {}
