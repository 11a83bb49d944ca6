"""checks.py's own schemathesis check: the one 5xx schemathesis.toml allows is held to
what it is allowed for."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.openapi.checks import a_504_is_the_clients_own_deadline

OWN = {"error": {"type": "deadline_exceeded", "message": "past this request's deadline"}}


def check(status: int, body: object, headers: dict[str, str] | None) -> None:
    response = SimpleNamespace(status_code=status, content=json.dumps(body).encode())
    a_504_is_the_clients_own_deadline(None, response, SimpleNamespace(headers=headers))


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (OWN, {"X-Request-Timeout": "1e-300"}),
        (OWN, {"x-request-timeout": "0.001"}),
        ({"error": "the request is past its deadline"}, {"X-Request-Timeout": "1e-9"}),  # V2's
    ],
)
def test_a_504_to_the_clients_own_deadline_passes(body, headers):
    check(504, body, headers)


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        (OWN, None, "set no X-Request-Timeout"),
        (OWN, {"X-Request-ID": "a"}, "set no X-Request-Timeout"),
        (
            {"error": {"type": "gateway_timeout", "message": "deadline"}},
            {"X-Request-Timeout": "1"},
            "does not name",
        ),
        ({"error": "the model took too long"}, {"X-Request-Timeout": "1"}, "does not name"),
    ],
)
def test_any_other_504_fails(body, headers, expected):
    with pytest.raises(AssertionError, match=expected):
        check(504, body, headers)


def test_other_statuses_are_left_to_the_other_checks():
    check(503, {"error": "anything"}, None)
    check(200, {}, None)
