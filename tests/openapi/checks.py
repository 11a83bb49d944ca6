"""schemathesis's own checks for this API, loaded by ``SCHEMATHESIS_HOOKS``."""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.check
def a_504_is_the_clients_own_deadline(ctx: Any, response: Any, case: Any) -> None:
    """The one 5xx schemathesis.toml lets the inference routes answer: a 504 to a
    request that set its own deadline (X-Request-Timeout), saying so."""
    if response.status_code != 504:
        return
    headers = {name.lower() for name in case.headers or {}}
    if "x-request-timeout" not in headers:
        raise AssertionError("a 504 to a request that set no X-Request-Timeout of its own")
    error = json.loads(response.content)["error"]
    if isinstance(error, str):  # V2's shape: the message alone
        kind, text = "deadline_exceeded", error
    else:  # ours, or OpenAI's, which keeps our type in its code
        kind, text = error.get("code") or error.get("type"), error.get("message", "")
    if kind != "deadline_exceeded" or "deadline" not in text:
        raise AssertionError(f"a 504 that does not name the request's deadline: {error!r}")
