from __future__ import annotations

import io
import logging
import os
import re
import time
from collections.abc import Callable, Iterator

import pytest

from serving_core.context import REQUEST_ID_OK, Context, new_request_id
from serving_core.web.openapirules import bounded
from tests.conftest import make_app
from tests.servers import wait_for


@pytest.fixture
def started_app() -> Iterator[Callable[..., object]]:
    """Builds and starts apps with the given settings; stops them all at the end."""
    apps = []

    def start(**env):
        app = make_app(**env)
        app.extensions["serving_core"].start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        app.extensions["serving_core"].stop()


def assert_error(response, status, type_):
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.is_json
    body = response.get_json()
    assert set(body) == {"error"}
    assert body["error"]["type"] == type_
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    assert "Traceback" not in response.get_data(as_text=True)
    return body["error"]


def test_a_json_request_is_answered_by_the_handler(client):
    response = client.post("/predict", json={"text": "hi"})
    assert response.status_code == 200
    assert response.get_json()["text"] == "hi"
    assert response.get_json()["batch_size"] == 1


def test_form_fields_and_query_parameters_reach_the_handler(client):
    response = client.post("/predict?text=query", data={"n": "1", "id": "form"})
    # "n" arrives as the string "1": forms carry strings, and the schema wants an integer.
    error = assert_error(response, 400, "invalid_input")
    assert error["details"] == [{"field": "n", "message": "'1' is not of type 'integer'"}]
    response = client.post("/predict?text=query", data={"id": "form"})
    assert response.status_code == 200
    assert response.get_json()["text"] == "query"


def test_an_uploaded_file_reaches_the_handler_as_bytes(app):
    seen = {}
    handler = app.extensions["serving_core"].handler
    original = handler.preprocess

    def spy(params):
        seen.update(params)
        return original(params)

    handler.preprocess = spy
    response = app.test_client().post(
        "/predict", data={"text": "x", "blob": (io.BytesIO(b"\x00\x01"), "b.bin")}
    )
    assert response.status_code == 200
    assert seen["blob"] == b"\x00\x01"


def test_a_schema_violation_is_a_400_naming_the_field(client):
    error = assert_error(client.post("/predict", json={"n": -1}), 400, "invalid_input")
    assert error["details"][0]["field"] == "n"
    assert "n:" in error["message"]


@pytest.mark.parametrize(
    ("kwargs", "status", "type_"),
    [
        ({"data": b"{oops", "content_type": "application/json"}, 400, "bad_request"),
        ({"data": b"[1]", "content_type": "application/json"}, 400, "bad_request"),
        ({"data": b'{"a": "\xff"}', "content_type": "application/json"}, 400, "bad_request"),
        ({"data": b"hello", "content_type": "text/plain"}, 415, "unsupported_media_type"),
        ({"json": {"early": True}}, 400, "invalid_input"),
        ({"json": {"late_bad": True}}, 400, "invalid_input"),
        ({"json": {"bad": True}}, 400, "invalid_input"),
    ],
)
def test_client_errors_are_json_4xx(client, kwargs, status, type_):
    assert_error(client.post("/predict", **kwargs), status, type_)


def test_json_sent_as_curl_ds_default_form_type_is_told_to_say_application_json(client):
    # curl -d '{"text": "hi"}' with no -H: not "'text' is a required property".
    sent = {"data": b'{"text": "hi"}', "content_type": "application/x-www-form-urlencoded"}
    error = assert_error(client.post("/predict", **sent), 400, "bad_request")
    assert "not application/json" in error["message"]
    assert "Content-Type: application/json" in error["message"]


def test_a_body_over_the_limit_is_413():
    app = make_app(max_body_bytes=64)
    response = app.test_client().post("/predict", json={"text": "x" * 100})
    assert_error(response, 413, "payload_too_large")


def test_a_body_over_the_limit_is_413_before_anything_else():
    app = make_app(max_body_bytes=64)  # not started: a 503 were it asked first
    response = app.test_client().post(
        "/predict",
        input_stream=Unread(),
        content_type="application/json",
        environ_overrides={"CONTENT_LENGTH": "65"},
    )
    assert_error(response, 413, "payload_too_large")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"a": ' * 5 + b"1" + b"}" * 5, "nests deeper than 4 levels (SERVING_MAX_JSON_DEPTH)"),
        (b'{"text": "' + b"x" * 33 + b'"}', "a string of 33 characters, more than SERVING_MAX_"),
        (b'{"' + b"k" * 40 + b'": 1}', "a string of 40 characters"),
    ],
)
def test_a_json_body_too_deep_or_with_too_long_a_string_is_a_400(started_app, body, message):
    app = started_app(max_json_depth=4, max_string_chars=32)
    response = app.test_client().post("/predict", data=body, content_type="application/json")
    assert message in assert_error(response, 400, "bad_request")["message"]
    response = app.test_client().post("/jobs", data=body, content_type="application/json")
    assert message in assert_error(response, 400, "bad_request")["message"]
    ok = app.test_client().post("/predict", json={"text": "x" * 32, "n": 1})
    assert ok.status_code == 200


class Unread(io.RawIOBase):
    """A request body that fails the test if anything reads it."""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True  # the test client asks where it starts

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def readinto(self, buffer) -> int:
        raise AssertionError("the body was read")


def test_a_full_queue_refuses_a_request_before_reading_its_body(started_app):
    app = started_app(max_batch_size=1, max_queue=1, max_wait_ms=0)
    service = app.extensions["serving_core"]
    batcher = service.runner.batcher
    deadline = time.monotonic() + 30
    running = batcher.submit({"sleep_s": 2}, Context("running", deadline), arrival=time.monotonic())
    wait_for(lambda: batcher.depth == 0, "the model thread to take the first item", timeout_s=30)
    queued = batcher.submit({}, Context("queued", deadline), arrival=time.monotonic())
    response = app.test_client().post(
        "/predict",
        input_stream=Unread(),
        content_type="application/json",
        environ_overrides={"CONTENT_LENGTH": str(1024 * 1024 - 1)},
    )
    error = assert_error(response, 503, "overloaded")
    assert "queue is full" in error["message"]
    assert response.headers["Retry-After"]
    assert batcher.depth == 1  # nothing was queued for it
    for pending in (running, queued):
        pending.future.result(timeout=30)


def test_unknown_routes_and_wrong_methods_are_json(client):
    assert_error(client.get("/nowhere"), 404, "not_found")
    error = client.get("/predict")
    assert_error(error, 405, "method_not_allowed")
    assert "POST" in error.headers["Allow"]
    assert_error(client.delete("/healthz"), 405, "method_not_allowed")


def test_a_failing_handler_is_a_500_without_traceback_and_the_next_request_works(client, caplog):
    with caplog.at_level(logging.ERROR):
        response = client.post(
            "/predict", json={"fail": True}, headers={"X-Request-ID": "req-boom"}
        )
    error = assert_error(response, 500, "model_error")
    assert "req-boom" in error["message"]
    assert "the probe was asked to fail" not in response.get_data(as_text=True)
    logged = [r for r in caplog.records if "req-boom" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert client.post("/predict", json={"text": "after"}).status_code == 200


def test_nan_has_no_json_form_and_is_written_as_null(client):
    response = client.post("/predict", json={"nan": True})
    assert response.status_code == 200
    assert response.get_json() == {"value": None}


def test_an_output_that_is_not_json_is_a_500(app, caplog):
    handler = app.extensions["serving_core"].handler
    handler.postprocess = lambda output, params: {"value": object()}
    with caplog.at_level(logging.ERROR):
        response = app.test_client().post("/predict", json={})
    assert_error(response, 500, "internal_error")
    assert "not JSON-serialisable" in caplog.text


def test_the_request_id_is_taken_or_generated_and_returned(client):
    response = client.post("/predict", json={"text": "a"}, headers={"X-Request-ID": "abc-123"})
    assert response.headers["X-Request-ID"] == "abc-123"
    generated = client.post("/predict", json={"text": "a"}).headers["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    unsafe = client.get("/healthz", headers={"X-Request-ID": "bad id\twith space"})
    assert re.fullmatch(r"[0-9a-f]{32}", unsafe.headers["X-Request-ID"])


def test_a_forked_worker_generates_other_request_ids_than_its_master():
    # Workers are forked from one master: ids from one generator state would repeat.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, "".join(new_request_id() for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 4096).decode()
    os.close(read)
    mine = [new_request_id() for _ in range(4)]
    theirs = [child[i : i + 32] for i in range(0, len(child), 32)]
    assert len(theirs) == 4
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in mine + theirs)
    assert not set(mine) & set(theirs)


@pytest.mark.parametrize("sent", ["abc\n", "a" * 129, "", "caf\u00e9"])
def test_a_request_id_is_kept_only_when_all_of_it_is_safe(sent):
    assert REQUEST_ID_OK.fullmatch(sent) is None


def test_a_client_deadline_shorter_than_the_work_is_a_504(client):
    response = client.post("/predict", json={"sleep_s": 0.5}, headers={"X-Request-Timeout": "0.1"})
    assert_error(response, 504, "deadline_exceeded")


@pytest.mark.parametrize("value", ["soon", "-1", "0", "inf", "nan"])
def test_a_bad_client_deadline_is_a_400(client, value):
    response = client.post("/predict", json={}, headers={"X-Request-Timeout": value})
    assert_error(response, 400, "bad_request")


def test_health_readiness_and_metadata(app, client):
    assert client.get("/healthz").get_json() == {"status": "alive"}
    assert client.get("/readyz").status_code == 200
    metadata = client.get("/metadata").get_json()
    assert metadata["name"] == "probe"
    assert metadata["version"] == "7"
    assert metadata["input_schema"]["properties"]["n"]["type"] == "integer"
    assert metadata["batching"]["batched"] is True
    assert metadata["batching"]["policy"] == "adaptive"
    app.extensions["serving_core"].stop()
    assert client.get("/readyz").status_code == 503
    assert_error(client.post("/predict", json={}), 503, "not_ready")


def test_not_ready_before_the_worker_starts():
    app = make_app()
    client = app.test_client()
    assert client.get("/readyz").status_code == 503
    assert client.get("/healthz").status_code == 200
    assert_error(client.post("/predict", json={}), 503, "not_ready")


def test_the_openapi_document_is_valid_and_carries_the_handlers_schema(app, client):
    from openapi_spec_validator import validate

    document = client.get("/openapi.json").get_json()
    validate(document)
    body = document["paths"]["/predict"]["post"]["requestBody"]["content"]
    service = app.extensions["serving_core"]
    # The handler's schema, with SERVING_MAX_STRING_CHARS on its strings (openapirules).
    limit = service.settings.max_string_chars
    assert body["application/json"]["schema"] == bounded(service.handler.input_schema, limit)
    assert body["application/json"]["schema"]["properties"]["text"]["maxLength"] == limit
    assert document["info"] == {"title": "probe", "version": "7"}


def test_the_app_asks_once_per_function_whether_it_is_a_coroutine_and_keeps_a_bounded_few():
    app = make_app()
    view = app.view_functions["predict"]
    assert app.ensure_sync(view) is view
    assert view in app._sync  # asked once, remembered
    # A function made per request (after_this_request) must not grow the table.
    for _ in range(app.SYNC_CACHED + 100):

        def made() -> None:
            pass

        assert app.ensure_sync(made) is made
    assert len(app._sync) == app.SYNC_CACHED
