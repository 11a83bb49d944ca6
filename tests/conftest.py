from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

from serving_core.loading import load_handler
from serving_core.process.server import build
from serving_core.settings import Settings
from tests import servers

HANDLERS = Path(__file__).parent / "handlers"
PROBE = str(HANDLERS / "probe" / "handler.py")
# The example handlers a user may delete from their copy of the template
# (README, "Your model"): tests of one carry @pytest.mark.example("NAME") and
# are skipped, saying why, once handlers/NAME is gone.
EXAMPLES = Path(__file__).resolve().parent.parent / "handlers"


def _without(names: tuple[str, ...]) -> str:
    """Why tests of the examples ``names`` skip, or "" while all of them are here."""
    gone = [f"handlers/{name}" for name in names if not (EXAMPLES / name).is_dir()]
    if not gone:
        return ""
    return (
        f"example handler not in this repository: {', '.join(gone)} (a template's"
        " owner may delete the examples; their tests go with them)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before the fixtures: a server they start checks the test's markers.
    servers.RUNNING[:] = [item]
    for mark in item.iter_markers("example"):
        if reason := _without(mark.args):
            pytest.skip(reason)


def example_module(example: str, module: str) -> ModuleType:
    """``module``, which only handlers/``example``'s requirements install, imported at
    the top of that example's test module; the whole module skips once it is deleted."""
    if reason := _without((example,)):
        pytest.skip(reason, allow_module_level=True)
    return importlib.import_module(module)


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
