"""The job queue's backends are one table (``jobs.backends.BACKENDS``): each checks its own
URL, a scheme not in the table is refused with the table's schemes, and a backend added
with one module and one table line runs a real ``serving-core worker``."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from serving_core.commands import startup
from serving_core.commands.failure import Failure
from serving_core.jobs import backends
from serving_core.jobs.backends import BACKENDS, backend_for, open_queue
from serving_core.jobs.base import StoreRefused
from serving_core.settings import Settings
from tests.conftest import PROBE
from tests.servers import ROOT, base_env, free_port, stop, wait_for

TOY = "tests.jobs.toybackend"


@pytest.mark.parametrize("scheme", BACKENDS)
def test_every_scheme_names_a_module_with_the_backend_interface(scheme):
    backend = importlib.import_module(BACKENDS[scheme])
    assert backend.SHARED in ("SERVING_JOBS_PATH", "SERVING_JOBS_URL")
    for name in ("check_url", "check_store", "open_queue"):
        assert callable(getattr(backend, name)), name


def test_the_queues_doc_names_the_schemes_of_the_table():
    queues = (ROOT / "docs/jobs.md").read_text().split("## The queues", 1)[1].split("\n## ")[0]
    named = {scheme for scheme in BACKENDS if f"`{scheme}://" in queues}
    assert named == set(BACKENDS) - {""}


def test_an_unknown_scheme_is_refused_with_the_tables_schemes_and_no_password():
    with pytest.raises(ValueError, match="names no job queue backend") as info:
        backend_for("postgresql://user:s3cret@db/jobs")
    message = str(info.value)
    assert "SERVING_JOBS_URL='postgresql://user:***@db/jobs' names no job queue backend" in message
    assert "sqlite://, redis://, rediss://, unix://" in message
    assert "s3cret" not in message


def test_the_settings_take_any_url_and_the_backend_checks_it_at_start():
    settings = Settings.from_env({"SERVING_JOBS_URL": "ftp://queue/1"}, cores=1)
    with pytest.raises(Failure, match="names no job queue backend"):
        startup.check_queue(settings)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis:/queue", "names no job queue backend"),  # no //: not the scheme's URL
        ("redis://queue:port/0", "has a port that is not 0..65535 for the job queue"),
        ("redis://user:s3cret@queue:99999/0", "'redis://user:***@queue:99999/0' has a port"),
        ("unix://", "names no socket path"),
        ("sqlite:///jobs.db", "set SERVING_JOBS_PATH to the file"),
    ],
)
def test_each_backend_checks_its_own_url_naming_the_variable_and_the_fix(url, expected):
    with pytest.raises(ValueError, match="SERVING_JOBS_URL=") as info:
        backends.check(Settings(jobs_url=url))
    message = str(info.value)
    assert "SERVING_JOBS_URL=" in message
    assert expected in message
    assert "s3cret" not in message


@pytest.mark.parametrize("url", ["redis://q:6379/1", "rediss://[::1]:6380", "unix:///r.sock"])
def test_redis_urls_that_redis_py_takes_are_taken(url):
    backend_for(url).check_url(url)


@pytest.mark.parametrize("url", ["", "sqlite://"])
def test_an_empty_url_or_a_bare_sqlite_one_is_the_file_at_jobs_path(url, tmp_path):
    path = tmp_path / "jobs.db"
    queue = open_queue(Settings(jobs_url=url, jobs_path=str(path)), "q")
    try:
        queue.submit({"text": "a"})
        assert queue.depth() == 1
    finally:
        queue.close()
    assert path.exists()


def test_a_backend_is_one_module_and_one_table_line(monkeypatch, tmp_path):
    url = f"toy://{tmp_path / 'toy.db'}"
    with pytest.raises(ValueError, match="names no job queue backend"):
        open_queue(Settings(jobs_url=url), "q")  # no table line yet
    monkeypatch.setitem(BACKENDS, "toy", TOY)
    startup.check_queue(Settings(jobs_url=url))
    with pytest.raises(StoreRefused, match="the toy store toy:///refused drops jobs"):
        backends.check(Settings(jobs_url="toy:///refused"))
    queue = open_queue(Settings(jobs_url=url), "q")
    try:
        job = queue.submit({"text": "a"})
        assert [taken.id for taken in queue.take("c", 8, 0)] == [job.id]
    finally:
        queue.close()


@pytest.mark.e2e
def test_a_worker_takes_its_jobs_from_a_backend_added_by_a_table_line(monkeypatch, tmp_path):
    url = f"toy://{tmp_path / 'toy.db'}"
    monkeypatch.setitem(BACKENDS, "toy", TOY)
    queue = open_queue(Settings(jobs_url=url), "probe")  # the probe handler's queue
    ids = [queue.submit({"text": f"t{i}"}).id for i in range(3)]
    # The worker's master adds the line before it starts: its consumers fork from it.
    code = (
        "import sys\n"
        "from serving_core.jobs.backends import BACKENDS\n"
        f"BACKENDS['toy'] = {TOY!r}\n"
        "from serving_core.commands.cli import main\n"
        "sys.exit(main(['worker']))\n"
    )
    env = {"SERVING_HANDLER": PROBE, "SERVING_JOBS_URL": url}
    env["SERVING_BIND"] = f"127.0.0.1:{free_port()}"
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=base_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def done() -> bool:
            assert worker.poll() is None, log_path.read_text()  # refused at start
            return all(queue.get(i).status == "done" for i in ids)

        wait_for(done, log_path.read_text, timeout_s=90)
        assert [queue.get(i).result["text"] for i in ids] == ["t0", "t1", "t2"]
    finally:
        stop(worker)
        queue.close()
