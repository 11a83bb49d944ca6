"""What /openapi.json states of the server's own rules (issue 42): the API keys as
security schemes and their 401s, and the limits it refuses past as bounds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from openapi_spec_validator import validate

from serving_core.v2.request import MAX_TENSORS
from serving_core.v2.tensors import MAX_RANK
from serving_core.web.openapirules import METHODS
from tests.conftest import HANDLERS, make_app

KEY = "k1-6f0e9a8b7c6d5e4f3a2b"
FUZZ = str(HANDLERS / "fuzz" / "handler.py")


@pytest.fixture
def started() -> Iterator[Callable[..., Flask]]:
    apps: list[Flask] = []

    def start(**env: object) -> Flask:
        app = make_app(max_wait_ms=1, **env)
        app.extensions["serving_core"].start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        app.extensions["serving_core"].stop()


def document_of(app: Flask) -> dict[str, Any]:
    response = app.test_client().get("/openapi.json", headers={"X-API-Key": KEY})
    assert response.status_code == 200, response.get_data(as_text=True)
    document: dict[str, Any] = response.get_json()
    validate(document)
    return document


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


def test_without_keys_the_document_declares_no_security(started):
    document = document_of(started())
    assert "security" not in document
    assert "securitySchemes" not in document["components"]
    assert all("401" not in op["responses"] for _, _, op in operations(document))


@pytest.mark.parametrize(
    ("env", "open_paths"),
    [
        ({}, {"/healthz", "/readyz", "/metrics"}),
        ({"private_endpoints": "true"}, {"/healthz", "/readyz"}),
        (
            {"public_metadata": "true"},
            # The V2 descriptions as /metadata (issue 42's I5).
            {"/healthz", "/readyz", "/metrics", "/metadata", "/v2", "/v2/models/{name}"}
            | {"/v2/models/{name}/versions/{version}"},
        ),
    ],
)
def test_with_keys_each_operation_says_whether_it_needs_one_as_the_server_does(
    started, env, open_paths
):
    """Every operation is called without a key: a 401 exactly where the document
    declares one, in the error shape it declares."""
    app = started(api_keys=KEY, jobs_enabled="true", **env)
    document = document_of(app)
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKey"]["name"] == "X-API-Key"
    assert document["security"] == [{"bearer": []}, {"apiKey": []}]
    client = app.test_client()
    for path, method, operation in operations(document):
        url = path.replace("{name}", "probe").replace("{version}", "7")
        response = client.open(url.replace("{job_id}", "0" * 32), method=method.upper())
        if path in open_paths:
            assert operation["security"] == [], path
            assert response.status_code != 401, (method, path)
            continue
        assert "security" not in operation, path  # the document's own applies
        declared = operation["responses"]["401"]
        assert response.status_code == 401, (method, path, response.status_code)
        assert "WWW-Authenticate" in declared["headers"]
        error = declared["content"]["application/json"]["schema"]["$ref"]
        assert error.endswith("/V2Error" if path.startswith("/v2") else "/Error"), path
        assert isinstance(response.get_json()["error"], str if "V2" in error else dict)


def test_the_bodies_carry_the_servers_limits(started):
    app = started(max_string_chars="300", max_body_bytes="5000", max_queue="40", max_json_depth="9")
    document = document_of(app)
    predict = document["paths"]["/predict"]["post"]
    body = predict["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["text"]["maxLength"] == 300
    assert body["propertyNames"]["maxLength"] == 300
    assert "5000 bytes" in predict["responses"]["413"]["description"]
    assert "deeper than 9 levels" in predict["requestBody"]["description"]
    request = document["components"]["schemas"]["V2InferenceRequest"]
    assert request["properties"]["id"]["maxLength"] == 300
    shape = request["properties"]["inputs"]["items"]["properties"]["shape"]
    assert (shape["minItems"], shape["maxItems"]) == (1, MAX_RANK)
    assert shape["prefixItems"] == [{"type": "integer", "minimum": 1, "maximum": 40}]
    assert request["properties"]["inputs"]["maxItems"] == MAX_TENSORS
    assert request["properties"]["outputs"]["maxItems"] == MAX_TENSORS
    jobs = document_of(started(jobs_enabled="true"))["paths"]["/jobs"]["post"]
    (key,) = jobs["parameters"]
    assert key["schema"]["pattern"] == "^[A-Za-z0-9._:/+=-]{1,128}$"


def test_the_server_refuses_a_string_one_past_the_documented_maxlength(started):
    app = started(max_string_chars="300")
    client = app.test_client()
    assert client.post("/predict", json={"text": "a" * 300}).status_code == 200
    assert client.post("/predict", json={"text": "a" * 301}).status_code == 400


def test_forms_are_described_in_words_and_only_json_as_a_schema(started):
    """A form's fields are strings whatever the schema says (a number comes as "5"),
    so a schema of them would promise what the handler refuses (issue 42)."""
    document = document_of(started(handler=FUZZ))
    body = document["paths"]["/predict"]["post"]["requestBody"]
    assert list(body["content"]) == ["application/json"]
    assert "multipart/form-data" in body["description"]
    response = started(handler=FUZZ).test_client().post("/predict", data={"text": "a form"})
    assert response.status_code == 200


def test_no_body_is_optional_only_when_the_handler_requires_nothing(started):
    document = document_of(started(handler=FUZZ))
    assert document["paths"]["/predict"]["post"]["requestBody"]["required"] is True
    app = started()  # the probe: no field required
    document = document_of(app)
    assert document["paths"]["/predict"]["post"]["requestBody"]["required"] is False
    assert app.test_client().post("/predict?text=from-the-query").status_code == 200


GENERATING = str(HANDLERS / "generating" / "handler.py")


def test_a_generators_max_tokens_is_bounded_where_the_server_refuses_more(started):
    app = started(handler=GENERATING, max_tokens="40")
    document = document_of(app)
    schemas = document["components"]["schemas"]
    predict = document["paths"]["/predict"]["post"]["requestBody"]["content"]
    assert predict["application/json"]["schema"]["properties"]["max_tokens"]["maximum"] == 40
    # A job's max_tokens is checked when it runs: /jobs takes it.
    jobs = document["paths"]["/jobs"]["post"]["requestBody"]["content"]
    assert "maximum" not in jobs["application/json"]["schema"]["properties"]["max_tokens"]
    for name in ("OpenAICompletionRequest", "OpenAIChatRequest"):
        for field in ("max_tokens", "max_completion_tokens"):
            assert schemas[name]["properties"][field]["maximum"] == 40
    generate = schemas["V2GenerateRequest"]["properties"]["parameters"]
    assert generate["properties"]["max_tokens"] == {"type": "integer", "minimum": 1, "maximum": 40}
    client = app.test_client()
    over = {"text_input": "a", "parameters": {"max_tokens": 41}}
    assert client.post("/v2/models/generating/generate", json=over).status_code == 400
    assert client.post("/predict", json={"prompt": "a", "max_tokens": 41}).status_code == 400


def test_a_streams_events_are_described_one_by_one(started):
    """schemathesis checks each server-sent event against the schema: its data's JSON."""
    document = document_of(started(handler=GENERATING))
    stream = document["paths"]["/v2/models/{name}/generate_stream"]["post"]["responses"]["200"]
    event = stream["content"]["text/event-stream"]["schema"]
    assert event["required"] == ["data"]
    data = event["properties"]["data"]
    assert data["contentMediaType"] == "application/json"
    assert data["contentSchema"]["anyOf"][0] == {"$ref": "#/components/schemas/V2GenerateResponse"}
    completions = document["paths"]["/v1/completions"]["post"]["responses"]["200"]["content"]
    done = completions["text/event-stream"]["schema"]["properties"]["data"]["anyOf"][0]
    assert done == {"const": "[DONE]"}
    prompt = document["components"]["schemas"]["OpenAICompletionRequest"]["properties"]["prompt"]
    assert prompt == {"type": "string", "maxLength": 256 * 1024}
