"""GET /docs: Swagger UI served by the app itself, tried in a real headless Chromium.

Chromium is Debian's (``make test`` installs it) and is driven over the
DevTools protocol on a pipe (``--remote-debugging-pipe``): no browser
download, no driver, no websocket library. Its host resolver answers
NOTFOUND for every name, so a page that needed a CDN would not render; the
test also checks that every request the page made went to 127.0.0.1.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import pytest
import requests

from tests.conftest import PROBE, make_app
from tests.servers import ROOT, gunicorn_server

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_docs_page_and_its_assets_are_served_by_the_app(client):
    page = client.get("/docs")
    assert page.status_code == 200
    assert page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    assert "<title>probe - API docs</title>" in html
    assert "http:" not in html
    assert "https:" not in html  # nothing from a CDN
    for asset in ("docs/swagger-ui-bundle.js", "docs/swagger-ui.css"):
        assert f'"{asset}"' in html
        with client.get("/" + asset) as response:
            assert response.status_code == 200
            assert len(response.data) > 10_000


def test_docs_serves_no_other_file_of_the_package(client):
    for path in ("/docs/index.html", "/docs/LICENSE", "/docs/..%2F__init__.py"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.get_json()["error"]["type"] == "not_found"


def test_docs_with_a_trailing_slash_redirects_to_the_page(client):
    response = client.get("/docs/")
    assert response.status_code == 308
    # Relative, so it keeps a proxy's prefix; resolved as a browser does (RFC 3986;
    # werkzeug's test client joins it otherwise).
    assert response.headers["Location"] == "../docs"
    assert client.get(urljoin("/docs/", "../docs")).mimetype == "text/html"


def test_docs_is_404_json_when_disabled():
    client = make_app(docs_enabled="false").test_client()
    for path in ("/docs", "/docs/", "/docs/swagger-ui-bundle.js"):
        response = client.get(path)
        assert response.status_code == 404
        assert response.get_json()["error"]["type"] == "not_found"
    assert client.get("/openapi.json").status_code == 200


def test_openapi_predict_example_is_the_handlers_sample(client):
    document = client.get("/openapi.json").get_json()
    body = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]
    sample = json.loads((Path(PROBE).parent / "sample.json").read_text())
    assert body["example"] == sample


class DevTools:
    """The DevTools protocol over Chromium's pipe: fd 3 in, fd 4 out, NUL-separated JSON."""

    def __init__(self, to_browser: int, from_browser: int) -> None:
        self.to_browser = to_browser
        self.from_browser = from_browser
        self.ids = itertools.count(1)
        self.buffer = b""
        self.events: list[dict[str, Any]] = []

    def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        message_id = next(self.ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout_s=60.0)
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            self.events.append(reply)

    def _read(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\0" not in self.buffer:
            ready, _, _ = select.select([self.from_browser], [], [], deadline - time.monotonic())
            if not ready:
                raise TimeoutError("Chromium sent nothing")
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return dict(json.loads(raw))


@contextlib.contextmanager
def chromium() -> Iterator[DevTools]:
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    # A helper killed mid-write can still leave a file behind as the profile goes:
    # that is no failure of the page under test.
    with tempfile.TemporaryDirectory(
        prefix="serving-chromium-", ignore_cleanup_errors=True
    ) as profile:
        # Chromium talks on its fd 3 (in) and 4 (out): the shell puts the pipe's ends there.
        wire = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        process = subprocess.Popen(
            [
                "/bin/bash",
                "-c",
                wire,
                CHROMIUM,
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",  # root in CI; the page is our own
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                f"--user-data-dir={profile}",
                "--window-size=1280,2000",
                "about:blank",
            ],
            pass_fds=(to_browser_r, from_browser_w),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        try:
            yield DevTools(to_browser_w, from_browser_r)
        finally:
            # The whole session: Chromium's renderer and helper processes outlive a
            # killed main process and keep writing into the profile being removed.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
            os.close(to_browser_w)
            os.close(from_browser_r)


# Resolves once `selector` matches an element whose text includes `text`: the
# page's own event loop does the waiting; the test waits on the promise.
WAIT_FOR = """
new Promise((resolve, reject) => {
  const started = Date.now();
  (function look() {
    const found = [...document.querySelectorAll(%(selector)s)]
      .find(e => e.textContent.includes(%(text)s));
    if (found) { resolve(found.textContent); return; }
    if (Date.now() - started > 30000) { reject(new Error("not found: " + %(selector)s)); return; }
    setTimeout(look, 50);
  })();
})
"""


def wait_for(tools: DevTools, session: str, selector: str, text: str = "") -> str:
    script = WAIT_FOR % {"selector": json.dumps(selector), "text": json.dumps(text)}
    result = tools.send(
        "Runtime.evaluate",
        {"expression": script, "awaitPromise": True, "returnByValue": True},
        session=session,
    )
    if "exceptionDetails" in result:
        raise AssertionError(f"the page never showed {selector} {text!r}: {result}")
    return str(result["result"]["value"])


def click(tools: DevTools, session: str, selector: str) -> None:
    wait_for(tools, session, selector)
    tools.send(
        "Runtime.evaluate",
        {"expression": f"document.querySelector({json.dumps(selector)}).click()"},
        session=session,
    )


@pytest.mark.e2e
def test_docs_page_renders_predict_and_try_it_out_returns_200_offline():
    ARTIFACTS.mkdir(exist_ok=True)
    with gunicorn_server({"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1"}) as server:
        with chromium() as tools:
            target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
                "sessionId"
            ]
            tools.send("Network.enable", session=session)
            tools.send("Page.enable", session=session)
            tools.send("Page.navigate", {"url": server.url + "/docs"}, session=session)

            operation = "#operations-default-post_predict"
            wait_for(tools, session, f"{operation} .opblock-summary-path", "/predict")
            click(tools, session, f"{operation} .opblock-summary-control")
            click(tools, session, f"{operation} .try-out__btn")
            # The body editor starts from the handler's sample.json.
            body = wait_for(tools, session, f"{operation} textarea.body-param__text", "warm")
            assert json.loads(body) == {"text": "warm"}
            click(tools, session, f"{operation} button.execute")
            status = wait_for(
                tools, session, f"{operation} .live-responses-table .response-col_status", "200"
            )
            assert status.strip().startswith("200")
            shot = tools.send("Page.captureScreenshot", {"format": "png"}, session=session)
            (ARTIFACTS / "docs.png").write_bytes(base64.b64decode(shot["data"]))

        urls = [
            event["params"]["request"]["url"]
            for event in tools.events
            if event.get("method") == "Network.requestWillBeSent"
        ]
        assert server.url + "/docs" in urls
        assert server.url + "/predict" in urls
        offsite = [u for u in urls if not u.startswith((server.url + "/", "data:"))]
        assert not offsite, f"the page reached beyond 127.0.0.1: {offsite}"
        # The server saw the page's call, and answered it.
        assert '"POST /predict HTTP/1.1" 200' in server.output()


@pytest.mark.e2e
def test_a_real_server_with_docs_disabled_answers_404():
    env = {"SERVING_HANDLER": PROBE, "SERVING_WORKERS": "1", "SERVING_DOCS_ENABLED": "false"}
    with gunicorn_server(env) as server:
        for path in ("/docs", "/docs/swagger-ui.css"):
            response = requests.get(server.url + path, timeout=10)
            assert response.status_code == 404
            assert response.json()["error"]["type"] == "not_found"
