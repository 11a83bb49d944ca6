"""Local files are private by default: the SQLite queue in a 0700 directory of its user, with
mode 0600, and the metrics clean-up deletes only prometheus-client's own files."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from serving_core.jobs.base import QueueUnavailable
from serving_core.jobs.sqlite.queue import SqliteJobQueue
from serving_core.settings import Settings
from tests.servers import ROOT


def mode(path: object) -> int:
    return stat.S_IMODE(os.stat(str(path)).st_mode)


def test_the_default_sqlite_queue_is_mode_0600_in_a_0700_directory_of_its_user(tmp_path):
    old = os.umask(0o022)  # SQLite's own default would then make it 0644
    try:
        settings = Settings.from_env({"TMPDIR": str(tmp_path)})
        queue = SqliteJobQueue(settings, "private")
        try:
            queue.submit({"text": "a"})
            directory = tmp_path / f"serving-core-{os.getuid()}"
            assert settings.jobs_path == str(directory / "jobs.db")
            assert mode(directory) == 0o700
            assert os.stat(directory).st_uid == os.getuid()
            files = sorted(p.name for p in directory.iterdir())
            assert files == ["jobs.db", "jobs.db-shm", "jobs.db-wal"]
            assert {name: mode(directory / name) for name in files} == dict.fromkeys(files, 0o600)
        finally:
            queue.close()
    finally:
        os.umask(old)


def test_a_default_directory_planted_by_someone_else_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    (tmp_path / f"serving-core-{os.getuid()}").symlink_to(elsewhere)
    settings = Settings.from_env({"TMPDIR": str(tmp_path)})
    with pytest.raises(QueueUnavailable, match="remove it, or set SERVING_JOBS_PATH"):
        SqliteJobQueue(settings, "private")
    assert list(elsewhere.iterdir()) == []


def test_metrics_clean_up_in_a_shared_directory_deletes_only_prometheus_files(tmp_path):
    others = ["jobs.db", "serving-core-jobs.db", "counter.db", "counter_12.db.bak", "notes.txt"]
    stale = ["counter_12.db", "gauge_livesum_12.db", "histogram_archive.db", "gauge_all_7.db"]
    for name in others + stale:
        (tmp_path / name).write_text(name)
    # A process of its own: prometheus-client chooses multiprocess mode when first imported.
    enable = "import sys; from serving_core.metrics import directory as d"
    enable += "; d.enable_multiprocess(sys.argv[1])"
    subprocess.run([sys.executable, "-c", enable, str(tmp_path)], cwd=ROOT, check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
