"""What docs/guarantees.md promises of the job queues under kills and restarts: a job is in
the store when ``submit`` returns (a SIGKILL of the process that accepted it loses
nothing), SQLite commits with synchronous=FULL, and a Redis with its append-only file on
keeps its jobs across a SIGKILL and a restart."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid

import pytest
import redis

from serving_core.jobs.backends import open_queue
from serving_core.jobs.sqlite.queue import SqliteJobQueue
from serving_core.settings import Settings
from tests.redis_server import redis_server
from tests.servers import ROOT, wait_for

pytestmark = pytest.mark.e2e

# Submits one job, prints its id, and kills itself before any clean-up could run.
SUBMIT_AND_DIE = """
import os, signal, sys
from serving_core.jobs.backends import open_queue
from serving_core.settings import Settings
queue = open_queue(Settings(jobs_url=sys.argv[1], jobs_path=sys.argv[2]), sys.argv[3])
print(queue.submit({"text": "accepted"}).id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_job_accepted_by_a_process_killed_right_after_is_taken_later(backend, tmp_path):
    name = f"kill-{uuid.uuid4().hex[:8]}"
    with redis_server() if backend == "redis" else contextlib.nullcontext("") as url:
        settings = Settings(jobs_url=url, jobs_path=str(tmp_path / "q.db"))
        command = [
            sys.executable,
            "-c",
            SUBMIT_AND_DIE,
            settings.jobs_url,
            settings.jobs_path,
            name,
        ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
        assert done.returncode == -signal.SIGKILL, done.stderr
        queue = open_queue(settings, name)
        try:
            [job] = queue.take("after", 10, 0)
        finally:
            queue.close()
    assert (job.id, job.params) == (done.stdout.strip(), {"text": "accepted"})


def test_the_sqlite_queue_commits_with_synchronous_full(tmp_path):
    queue = SqliteJobQueue(Settings(jobs_path=str(tmp_path / "q.db")), "sync")
    try:
        with queue.file.reading() as db:
            [(level,)] = db.execute("PRAGMA synchronous").fetchall()
            [(journal,)] = db.execute("PRAGMA journal_mode").fetchall()
    finally:
        queue.close()
    assert (level, journal) == (2, "wal")  # 2: FULL, an fsync of the WAL at every commit


def test_a_workers_consumer_commits_with_synchronous_normal(tmp_path):
    # Its takes and results: a power cut may undo the last of them, and the jobs run
    # again after their lease (docs/guarantees.md); a killed process loses none.
    settings = Settings(jobs_path=str(tmp_path / "q.db"))
    consumer = open_queue(settings, "sync", consumer=True)
    assert isinstance(consumer, SqliteJobQueue)
    try:
        with consumer.file.reading() as db:
            [(level,)] = db.execute("PRAGMA synchronous").fetchall()
    finally:
        consumer.close()
    assert level == 1  # NORMAL


def test_jobs_in_a_redis_with_its_append_only_file_survive_its_sigkill_and_restart(tmp_path):
    aof = ["--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"]
    with redis_server(options=aof, data_dir=tmp_path) as url:
        queue = open_queue(Settings(jobs_url=url), "restart")
        try:
            ids = [queue.submit({"n": n}).id for n in range(3)]
            [taken] = queue.take("before", 1, 0)  # one running when Redis dies
        finally:
            queue.close()
        with redis.Redis.from_url(url) as client:
            pid = int(client.info("server")["process_id"])
        os.kill(pid, signal.SIGKILL)  # no shutdown: only what reached the AOF remains
    with redis_server(options=aof, data_dir=tmp_path) as url:
        queue = open_queue(Settings(jobs_url=url, jobs_lease_s=0.1), "restart")
        try:
            assert queue.depth() == 3
            assert queue.get(taken.id).status == "running"
            again = {job.id for job in queue.take("after", 10, 0)}
            # The running one is handed out again once its lease passes.
            wait_for(
                lambda: (
                    again.update(job.id for job in queue.take("after", 10, 0.1))
                    or again == set(ids)
                ),
                "every job taken again",
            )
        finally:
            queue.close()
