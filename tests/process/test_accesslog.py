"""The access line's batch size is the one the front door's answer record carries, on
every front: ``/predict`` and the V2 REST route (``process.accesslog``, through the
WSGI environ) and gRPC's ``ModelInfer`` (``grpc.accesslog``)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flask import Flask
from gunicorn.config import Config

from serving_core.online.door import Answered, FrontDoor, Head
from serving_core.process.accesslog import JsonAccessLogger
from tests.conftest import make_app
from tests.v2.grpc_call import Call

HANDLER = str(Path(__file__).parents[1] / "v2" / "tensors_handler.py")
RECORDED = 7  # no batch of this handler's is this large (SERVING_MAX_BATCH_SIZE=2)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.fields: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.fields.append(record.fields)  # type: ignore[attr-defined]


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    """The app, whose door's every answer records a batch of ``RECORDED``."""
    answer = FrontDoor.answer

    def recorded(door: FrontDoor, params: Any, head: Head) -> Answered[Any]:
        return dataclasses.replace(answer(door, params, head), batch_size=RECORDED)

    monkeypatch.setattr(FrontDoor, "answer", recorded)
    app = make_app(HANDLER, max_wait_ms=1, max_batch_size=2, cache_size=0)
    service = app.extensions["serving_core"]
    service.start()
    yield app
    service.stop()


@pytest.fixture
def lines() -> Iterator[Lines]:
    """What reaches the ``gunicorn.access`` logger, which gunicorn's logger sets up."""
    loggers = [logging.getLogger(name) for name in ("gunicorn.access", "gunicorn.error")]
    before = [(log.level, log.propagate, list(log.handlers)) for log in loggers]
    handler = Lines()
    loggers[0].addHandler(handler)
    loggers[0].setLevel(logging.INFO)
    yield handler
    for log, (level, propagate, handlers) in zip(loggers, before, strict=True):
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate


def served(app: Flask, path: str, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The response, and the WSGI environ the app left it in, as gunicorn hands both
    to its logger."""
    environs: list[dict[str, Any]] = []
    wsgi = app.wsgi_app

    def kept(environ: dict[str, Any], start_response: Any) -> Any:
        environs.append(environ)
        return wsgi(environ, start_response)

    app.wsgi_app = kept  # type: ignore[method-assign]
    try:
        response = app.test_client().post(path, json=body)
    finally:
        app.wsgi_app = wsgi  # type: ignore[method-assign]
    (environ,) = environs
    return response, environ


def access_line(response: Any, environ: dict[str, Any], lines: Lines) -> dict[str, Any]:
    config = Config()
    config.set("accesslog", "-")
    logger = JsonAccessLogger(config)
    raw = SimpleNamespace(status=response.status, headers=list(response.headers), sent=0)
    logger.access(raw, None, environ, timedelta(milliseconds=3))
    (fields,) = lines.fields
    return fields


def test_the_predict_access_line_has_the_records_batch_size(app, lines):
    response, environ = served(app, "/predict", {"values": [1, 2, 3]})
    assert response.status_code == 200, response.get_data()
    fields = access_line(response, environ, lines)
    assert (fields["route"], fields["batch_size"]) == ("/predict", RECORDED)


def test_the_v2_rest_access_line_has_the_records_batch_size(app, lines):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    response, environ = served(app, "/v2/models/scaler/infer", body)
    assert response.status_code == 200, response.get_data()
    fields = access_line(response, environ, lines)
    assert (fields["route"], fields["batch_size"]) == ("/v2/models/<name>/infer", RECORDED)


def test_a_refused_request_has_no_batch_size(app, lines):
    response, environ = served(app, "/predict", {"values": "not numbers"})
    assert response.status_code == 400
    assert access_line(response, environ, lines)["batch_size"] is None


def test_the_grpc_access_line_has_the_records_batch_size(app, lines):
    pb = pytest.importorskip("serving_core.grpc.proto.grpc_predict_v2_pb2")
    from serving_core.grpc.servicer import InferenceServicer
    from serving_core.v2.model import Model

    door = FrontDoor(app.extensions["serving_core"])
    servicer = InferenceServicer(Model(door), door)
    request = pb.ModelInferRequest(model_name="scaler", id="grpc-1")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(np.asarray([1, 2, 3], dtype="<f4").tobytes())
    reply = servicer.ModelInfer(request, Call())
    assert reply.outputs
    (fields,) = lines.fields
    assert (fields["request_id"], fields["grpc_status"]) == ("grpc-1", "OK")
    assert fields["batch_size"] == RECORDED
