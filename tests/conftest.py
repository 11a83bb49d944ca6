from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from serving_core.loading import load_handler
from serving_core.process.server import build
from serving_core.settings import Settings
from tests import servers

# The example handlers a template's owner deletes (README, "Your model", step 5):
# tests of one are not collected once handlers/NAME is gone (that module's hooks).
pytest_plugins = ["tests.example_handlers"]

HANDLERS = Path(__file__).parent / "handlers"
PROBE = str(HANDLERS / "probe" / "handler.py")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the fixtures: a server they start checks the test's markers.
    servers.RUNNING[:] = [item]


def make_app(handler=PROBE, **env):
    # Each app its own job queue file: the default one is shared by the machine.
    jobs = Path(tempfile.mkdtemp(prefix="serving-test-jobs-")) / "jobs.db"
    # The test client answers each request on a plain thread, as the gthread worker
    # does; the gevent worker's futures wake only through a running hub.
    environ = {
        "SERVING_HANDLER": handler,
        "SERVING_JOBS_PATH": str(jobs),
        "SERVING_WORKER_CLASS": "gthread",
    }
    environ.update({f"SERVING_{k.upper()}": str(v) for k, v in env.items()})
    settings = Settings.from_env(environ, cores=1)
    loaded = load_handler(settings.handler)
    loaded.handler.setup()
    app, _, _ = build(settings, loaded)
    return app


@pytest.fixture
def app():
    app = make_app(max_wait_ms=1)
    service = app.extensions["serving_core"]
    service.start()
    yield app
    service.stop()


@pytest.fixture
def client(app):
    return app.test_client()
