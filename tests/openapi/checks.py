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


@schemathesis.check
def a_503_is_admission_with_a_retry_hint(ctx: Any, response: Any, case: Any) -> None:
    """A 503 the inference routes may answer: admission's refusal of a request whose
    own short deadline the busy model cannot meet now but an idle one could (a retry
    can succeed, so not the 504), with its Retry-After. Any other 503 fails."""
    if response.status_code != 503:
        return
    headers = {name.lower() for name in case.headers or {}}
    if "x-request-timeout" not in headers:
        raise AssertionError("a 503 to a request that set no X-Request-Timeout of its own")
    if "retry-after" not in {name.lower() for name in response.headers}:
        raise AssertionError("a 503 without its Retry-After")
    if "deadline" not in response.text:
        raise AssertionError(f"a 503 that does not name the deadline: {response.text!r}")
