"""The CloudEvent of one exchange: CloudEvents 1.0's required attributes, the model's
extension attributes, and the request with its answer or its error."""

from __future__ import annotations

import re
import time
from datetime import datetime

import orjson

from serving_core.errors import InvalidParams
from serving_core.handler import Handler
from serving_core.payloads.event import Exchange, Origin, encode, event
from serving_core.payloads.redaction import Redaction
from tests.payloads.recorder import ORIGIN

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
EXTENSION_NAME = re.compile(r"[a-z0-9]{1,20}")  # CloudEvents: lowercase letters and digits


def answered(**changes):
    fields = {
        "request_id": "req-1",
        "params": {"text": "hello", "password": "p"},
        "output": {"label": "greeting"},
        "error": None,
        "time": time.time(),
    }
    return Exchange(**{**fields, **changes})


def test_an_answer_is_a_cloudevent_with_the_required_attributes():
    made = event(answered(), ORIGIN, Redaction())
    assert made["specversion"] == "1.0"
    for required in ("id", "source", "type"):
        assert isinstance(made[required], str)
        assert made[required]
    assert made["source"] == "serving-core/probe"
    assert made["type"] == "io.serving-core.inference"
    assert made["datacontenttype"] == "application/json"
    assert datetime.fromisoformat(made["time"]).tzinfo is not None  # RFC 3339, in UTC
    assert made["time"].endswith("Z")
    assert made["data"] == {
        "request": {"text": "hello", "password": "[redacted]"},
        "response": {"label": "greeting"},
    }


def test_its_extension_attributes_name_the_request_and_the_model_as_served():
    made = event(answered(traceparent=TRACEPARENT), ORIGIN, Redaction())
    assert made["requestid"] == "req-1"
    assert made["modelname"] == "probe"
    assert made["modelversion"] == "7"
    assert made["modelrevision"] == "abc123+sha256:feed"
    assert made["traceparent"] == TRACEPARENT
    context = set(made) - {"data"}
    assert all(EXTENSION_NAME.fullmatch(name) for name in context), context


def test_an_untraced_request_has_no_traceparent():
    assert "traceparent" not in event(answered(), ORIGIN, Redaction())


def test_every_event_has_an_id_of_its_own():
    exchange = answered()
    assert len({event(exchange, ORIGIN, Redaction())["id"] for _ in range(100)}) == 100


def test_an_error_has_its_status_and_message_where_an_answer_has_its_response():
    error = InvalidParams("text must be a string")
    made = event(answered(output=None, error=error), ORIGIN, Redaction())
    assert made["data"] == {
        "request": {"text": "hello", "password": "[redacted]"},
        "error": {"status": 400, "message": "text must be a string"},
    }


def test_the_event_encodes_as_one_json_object():
    made = event(answered(), ORIGIN, Redaction())
    assert orjson.loads(encode(made)) == made


def test_the_origin_carries_the_model_revision_of_build_and_artifacts():
    class Model(Handler):
        name = "sentiment"
        version = "2"

    handler = Model()
    handler.artifacts_revision = "sha256:5d41"
    origin = Origin.of(handler, "3f9c2e1")
    assert origin == Origin("sentiment", "2", "3f9c2e1+sha256:5d41")
    assert Origin.of(Model(), "").revision == ""
