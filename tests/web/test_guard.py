"""Who may call: API keys, private endpoints, CORS, and what a 4xx quotes of the client.

In-process tests use Flask's test client over the probe handler; the end-to-end
ones start a real ``serving-core serve`` and read everything it wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from flask import Flask

from serving_core.engine.engine import MAX_FIELD_ERRORS, Engine
from serving_core.errors import InvalidParams
from serving_core.handler import Handler
from serving_core.settings import SettingsError
from serving_core.web import guard
from tests.conftest import make_app
from tests.servers import gunicorn_server

KEY = "k1-6f0e9a8b7c6d5e4f3a2b"
OTHER_KEY = "k2-0c1d2e3f4a5b6c7d8e9f"
WRONG_KEY = "k3-ffeeddccbbaa99887766"
ORIGIN = "https://app.example.com"


@pytest.fixture
def started() -> Iterator[Callable[..., Flask]]:
    """Builds and starts apps with the given settings; stops them all at the end."""
    apps: list[Flask] = []

    def start(**env: object) -> Flask:
        app = make_app(max_wait_ms=1, **env)
        app.extensions["serving_core"].start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        app.extensions["serving_core"].stop()


@pytest.fixture
def keyed(started) -> Flask:
    return started(api_keys=f"{KEY},{OTHER_KEY}")


def assert_401(response) -> dict[str, str]:
    assert response.status_code == 401, response.get_data(as_text=True)
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="serving-core"'
    body = response.get_json()
    assert set(body) == {"error"}
    assert body["error"]["type"] == "unauthorized"
    assert KEY not in response.get_data(as_text=True)
    assert WRONG_KEY not in response.get_data(as_text=True)
    return body["error"]


# -- keys ------------------------------------------------------------------------


def test_without_keys_every_route_is_open(started):
    app = started()
    client = app.test_client()
    assert client.post("/predict", json={"text": "a"}).status_code == 200
    assert client.get("/metadata").status_code == 200
    assert client.get("/docs").status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": f"Bearer {WRONG_KEY}"},
        {"X-API-Key": WRONG_KEY},
        {"Authorization": f"Basic {KEY}"},  # the key, but not as a bearer token
        {"Authorization": "Bearer "},
        {"X-API-Key": KEY[:-1]},
        {"X-API-Key": KEY + "x"},
    ],
    ids=["none", "wrong-bearer", "wrong-header", "basic", "empty-bearer", "prefix", "longer"],
)
def test_a_missing_or_wrong_key_is_a_json_401(keyed, headers):
    error = assert_401(keyed.test_client().post("/predict", json={"text": "a"}, headers=headers))
    assert "Authorization: Bearer <key>" in error["message"] or "not one" in error["message"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}"},
        {"Authorization": f"bearer  {OTHER_KEY} "},
        {"X-API-Key": KEY},
        {"X-API-Key": OTHER_KEY},
        {"Authorization": "Basic dXNlcjpwYXNz", "X-API-Key": KEY},
    ],
    ids=["bearer", "bearer-lowercase-other-key", "header", "header-other-key", "basic-and-header"],
)
def test_a_right_key_passes_in_either_header(keyed, headers):
    response = keyed.test_client().post("/predict", json={"text": "a"}, headers=headers)
    assert response.status_code == 200
    assert response.get_json()["text"] == "a"


def test_every_route_but_health_needs_the_key(keyed):
    client = keyed.test_client()
    for path in ["/healthz", "/readyz"]:
        assert client.get(path).status_code == 200
    assert_401(client.post("/jobs", json={"text": "a"}))
    assert_401(client.get("/jobs/0123"))
    assert_401(client.delete("/jobs/0123"))
    assert_401(client.get("/docs"))
    assert_401(client.get("/docs/swagger-ui.css"))
    # No route list for a caller without a key: an unknown path is a 401 too.
    assert_401(client.get("/nowhere"))
    assert_401(client.options("/predict"))
    job = client.post("/jobs", json={"text": "a"}, headers={"X-API-Key": KEY})
    assert job.status_code == 202
    status = client.get(job.headers["Location"], headers={"X-API-Key": KEY})
    assert status.status_code == 200
    assert client.get("/docs", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_with_keys_metadata_and_openapi_need_one_and_metrics_stays_open(keyed):
    client = keyed.test_client()
    for path in ["/metadata", "/openapi.json"]:
        assert_401(client.get(path))
        assert client.get(path, headers={"X-API-Key": KEY}).status_code == 200, path
    assert client.get("/metrics").status_code == 200  # Prometheus scrapes without a key


def test_public_metadata_opens_metadata_and_openapi_to_anyone(started):
    app = started(api_keys=KEY, public_metadata="true")
    client = app.test_client()
    for path in ["/metadata", "/openapi.json", "/metrics"]:
        assert client.get(path).status_code == 200, path
    assert_401(client.get("/docs"))
    assert_401(client.post("/predict", json={"text": "a"}))


def test_public_metadata_and_private_endpoints_together_are_refused():
    with pytest.raises(SettingsError, match="set one of the two"):
        make_app(api_keys=KEY, public_metadata="true", private_endpoints="true")


def test_private_endpoints_need_the_key_when_there_are_keys(started):
    app = started(api_keys=KEY, private_endpoints="true")
    client = app.test_client()
    for path in ["/metadata", "/openapi.json", "/metrics", "/docs"]:
        assert_401(client.get(path))
        assert client.get(path, headers={"X-API-Key": KEY}).status_code == 200, path


def test_private_endpoints_are_not_served_without_keys(started):
    app = started(private_endpoints="true")
    client = app.test_client()
    for path in ["/metadata", "/openapi.json", "/metrics", "/docs", "/docs/swagger-ui.css"]:
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.get_json()["error"]["type"] == "not_found"
        # The 404 does not point at what is hidden.
        assert "openapi.json for" not in response.get_json()["error"]["message"]
    assert client.post("/predict", json={"text": "a"}).status_code == 200
    assert client.get("/healthz").status_code == 200


def test_the_keys_file_is_read_and_a_changed_file_is_taken(started, tmp_path, monkeypatch):
    monkeypatch.setattr(guard, "RELOAD_S", 0.0)
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{KEY}\n\n{OTHER_KEY}\n")
    app = started(api_keys_file=keys_file)
    client = app.test_client()
    assert client.post("/predict", json={}, headers={"X-API-Key": OTHER_KEY}).status_code == 200
    keys_file.write_text(f"{WRONG_KEY}\n")  # rotated: another size, so another stamp
    assert_401(client.post("/predict", json={}, headers={"X-API-Key": OTHER_KEY}))
    assert client.post("/predict", json={}, headers={"X-API-Key": WRONG_KEY}).status_code == 200
    assert client.get("/readyz").status_code == 200


def test_a_broken_keys_file_revokes_the_removed_key_and_turns_readyz_red(
    started, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(guard, "RELOAD_S", 0.0)
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{KEY}\n{OTHER_KEY}\n")
    app = started(api_keys_file=keys_file)
    client = app.test_client()
    assert client.get("/readyz").status_code == 200
    assert "serving_api_keys_file_errors 0.0" in metrics_text(client)
    # Rotated with a typo: OTHER_KEY removed, a short line added.
    keys_file.write_text(f"{KEY}\nnot-a-key\n")
    assert_401(client.post("/predict", json={}, headers={"X-API-Key": OTHER_KEY}))
    assert client.post("/predict", json={}, headers={"X-API-Key": KEY}).status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert "line 2" in ready.get_json()["reason"]
    assert "not-a-key" not in ready.get_data(as_text=True) + caplog.text
    assert "serving_api_keys_file_errors 1.0" in metrics_text(client)
    assert "SERVING_API_KEYS_FILE has 1 line(s) that are not keys" in caplog.text
    # Emptied, then removed: no key from it passes, and the check stays on.
    for broken in (lambda: keys_file.write_text(""), keys_file.unlink):
        broken()
        assert_401(client.post("/predict", json={}))
        assert_401(client.post("/predict", json={}, headers={"X-API-Key": KEY}))
        assert client.get("/readyz").status_code == 503
    keys_file.write_text(f"{OTHER_KEY}\n")  # fixed
    assert client.get("/readyz").status_code == 200
    assert client.post("/predict", json={}, headers={"X-API-Key": OTHER_KEY}).status_code == 200
    assert "serving_api_keys_file_errors 0.0" in metrics_text(client)


def metrics_text(client) -> str:
    return client.get("/metrics").get_data(as_text=True)


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "FileNotFoundError"), ("\n\n", "holds no keys"), ("short\n", "openssl rand")],
    ids=["missing", "empty", "weak"],
)
def test_a_keys_file_that_cannot_be_used_stops_the_app_naming_it(tmp_path, content, expected):
    keys_file = tmp_path / "keys"
    if content is not None:
        keys_file.write_text(content)
    with pytest.raises(SettingsError) as refused:
        make_app(api_keys_file=keys_file)
    assert "SERVING_API_KEYS_FILE" in str(refused.value)
    assert expected in str(refused.value)


# -- CORS ------------------------------------------------------------------------


def preflight(client, origin: str, headers: str = "authorization, content-type"):
    return client.options(
        "/predict",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": headers,
        },
    )


def test_cors_is_off_by_default(keyed):
    client = keyed.test_client()
    response = client.post("/predict", json={}, headers={"Origin": ORIGIN, "X-API-Key": KEY})
    assert response.status_code == 200
    assert not [name for name, _ in response.headers if name.startswith("Access-Control-")]
    # No preflight is answered either: an OPTIONS needs the key like any request.
    assert_401(preflight(client, ORIGIN))


def test_a_preflight_from_an_allowed_origin_is_answered_without_a_key(started):
    app = started(api_keys=KEY, cors_origins=f"{ORIGIN},http://localhost:3000")
    client = app.test_client()
    response = preflight(client, ORIGIN, "authorization, x-api-key, content-type")
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in response.headers["Access-Control-Allow-Methods"]
    allowed = response.headers["Access-Control-Allow-Headers"].lower()
    assert {"authorization", "x-api-key", "content-type"} <= set(allowed.split(", "))
    assert response.headers["Vary"] == "Origin"
    # The request itself: the browser may read the answer and its request id.
    answer = client.post("/predict", json={}, headers={"Origin": ORIGIN, "X-API-Key": KEY})
    assert answer.status_code == 200
    assert answer.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "X-Request-ID" in answer.headers["Access-Control-Expose-Headers"]
    # A 401 is readable too, so a page can tell its user the key is wrong.
    refused = client.post("/predict", json={}, headers={"Origin": ORIGIN})
    assert_401(refused)
    assert refused.headers["Access-Control-Allow-Origin"] == ORIGIN


@pytest.mark.parametrize(
    "origin",
    ["https://evil.example.com", "https://app.example.com.evil.net", "http://app.example.com"],
)
def test_a_preflight_from_another_origin_gets_no_cors_headers(started, origin):
    app = started(cors_origins=ORIGIN)
    client = app.test_client()
    response = preflight(client, origin)
    assert "Access-Control-Allow-Origin" not in response.headers
    assert "Access-Control-Allow-Methods" not in response.headers
    answer = client.post("/predict", json={}, headers={"Origin": origin})
    assert "Access-Control-Allow-Origin" not in answer.headers


def test_a_wildcard_lets_any_origin_without_credentials(started):
    app = started(cors_origins="*")
    response = preflight(app.test_client(), "https://anywhere.example")
    assert response.headers["Access-Control-Allow-Origin"] == "*"
    assert "Access-Control-Allow-Credentials" not in response.headers


# -- what an error quotes ---------------------------------------------------------

# A message quotes at most QUOTE_CHARS of the client's value; the rest of it is ours.
SHORT_ENOUGH = 400


@pytest.mark.parametrize(
    "body",
    [
        {"n": "x" * (1024 * 1024 - 100)},  # a 1 MiB wrong-typed value
        {"text": ["y" * 1000] * 900},  # a long list where a string belongs
        {"n": {"z" * 10_000: ["deep"] * 10}},
    ],
    ids=["long-string", "long-list", "long-object"],
)
def test_a_long_bad_value_is_quoted_truncated_in_the_400(started, body):
    # Strings this long pass SERVING_MAX_STRING_CHARS here: the schema quotes them.
    app = started(max_body_bytes=2 * 1024 * 1024, max_string_chars=2 * 1024 * 1024)
    response = app.test_client().post("/predict", json=body)
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["type"] == "invalid_input"
    assert len(error["message"]) < SHORT_ENOUGH, error["message"]
    assert len(json.dumps(error["details"])) < SHORT_ENOUGH
    assert "..." in error["message"] or "\u2026" in error["message"]
    assert len(response.get_data()) < 2 * SHORT_ENOUGH


class Numbers(Handler):
    name = "numbers"
    input_schema = {  # noqa: RUF012 (as a user writes it)
        "type": "object",
        "properties": {"values": {"type": "array", "items": {"type": "integer"}}},
    }

    def predict(self, item: Any) -> Any:
        return item


def test_many_schema_errors_are_reported_up_to_a_count():
    engine = Engine(Numbers(), max_batch_size=1)
    with pytest.raises(InvalidParams) as few:
        engine.validate({"values": [1, "a", 2, "b"]})
    assert [d["field"] for d in few.value.details] == ["values/1", "values/3"]
    with pytest.raises(InvalidParams) as many:
        engine.validate({"values": ["x" * 1000] * 100_000})
    assert len(many.value.details) == MAX_FIELD_ERRORS
    assert many.value.message.endswith(f"; and {100_000 - MAX_FIELD_ERRORS} more")
    assert len(many.value.message) < MAX_FIELD_ERRORS * SHORT_ENOUGH


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [
        ({"data": b"x", "content_type": "text/" + "p" * 5000}, 415),
        ({"json": {}, "headers": {"X-Request-Timeout": "9" * 5000 + "s"}}, 400),
    ],
    ids=["content-type", "request-timeout"],
)
def test_a_long_header_is_quoted_truncated(started, kwargs, status):
    response = started().test_client().post("/predict", **kwargs)
    assert response.status_code == status
    assert len(response.get_json()["error"]["message"]) < SHORT_ENOUGH


def test_a_long_unknown_path_is_quoted_truncated(client):
    response = client.get("/" + "a" * 3000)
    assert response.status_code == 404
    assert len(response.get_json()["error"]["message"]) < SHORT_ENOUGH


# -- a real server ------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_real_server_checks_keys_and_never_logs_them(tmp_path: Path, log_format: str) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{OTHER_KEY}\n")
    env = {
        "SERVING_HANDLER": "tests/handlers/probe/handler.py",
        "SERVING_WORKERS": "1",
        "SERVING_MAX_WAIT_MS": "1",
        # debug: every line serving-core and gunicorn would ever write about a request.
        "SERVING_LOG_LEVEL": "debug",
        "SERVING_LOG_FORMAT": log_format,
        "SERVING_API_KEYS": KEY,
        "SERVING_API_KEYS_FILE": str(keys_file),
    }
    with gunicorn_server(env) as server:
        url = server.url

        def post(path: str, headers: dict[str, str]) -> requests.Response:
            return requests.post(url + path, json={"text": "a"}, headers=headers, timeout=10)

        assert post("/predict", {}).status_code == 401
        wrong = post("/predict", {"Authorization": f"Bearer {WRONG_KEY}"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["type"] == "unauthorized"
        assert wrong.headers["WWW-Authenticate"].startswith("Bearer")
        assert post("/predict", {"X-API-Key": WRONG_KEY}).status_code == 401
        assert post("/predict", {"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert post("/predict", {"X-API-Key": OTHER_KEY}).status_code == 200
        assert post("/jobs", {}).status_code == 401
        assert post("/jobs", {"X-API-Key": WRONG_KEY}).status_code == 401
        job = post("/jobs", {"Authorization": f"Bearer {OTHER_KEY}"})
        assert job.status_code == 202
        job_id = job.json()["job_id"]
        status_url = url + job.headers["Location"]
        assert requests.get(status_url, timeout=10).status_code == 401
        # The job is OTHER_KEY's: any other key is told it does not exist.
        for method in (requests.get, requests.delete):
            assert method(status_url, headers={"X-API-Key": KEY}, timeout=10).status_code == 404
        owned = requests.get(status_url, headers={"X-API-Key": OTHER_KEY}, timeout=10)
        assert owned.status_code == 200
        for path in ["/healthz", "/readyz"]:
            assert requests.get(url + path, timeout=10).status_code == 200
        log = server.output()
    # The log is the one the server wrote: it has the access lines of the 401s.
    assert "401" in log
    assert "/jobs" in log
    assert f"/jobs/{job_id[:8]}..." in log  # the access lines tell the job apart
    for secret in [KEY, OTHER_KEY, WRONG_KEY, KEY[4:20], OTHER_KEY[4:20], job_id, job_id[8:]]:
        assert secret not in log
