"""Lending idle cores (``serving_core.threads``): the shared ledger between forked
processes, then ``serve`` and ``worker`` giving a lone request or job every core."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import requests

from serving_core import threads
from serving_core.cores import usable_cores
from serving_core.jobs.backends import open_queue
from serving_core.settings import Settings
from tests.servers import ROOT, gunicorn_server, job_worker, wait_for

# Lending sets torch's threads: a clone whose handlers never install torch has
# nothing to lend (``set_model_threads`` touches torch only when it is imported).
pytest.importorskip("torch", reason="no handler here installs torch")

FORK = multiprocessing.get_context("fork")
FORKWARM = str(ROOT / "tests/handlers/forkwarm/handler.py")  # answers torch's thread count
IDLE_LONG_ENOUGH_S = 3 * threads.LEND_AFTER_S
# Between a consumer's stored result and its idle mark there are a few lines of
# Python: waiting this long leaves room for a loaded machine's scheduling.
SETTLE_S = 0.5


def _child(lending: threads.CoreLending, conn: Connection) -> None:
    """A forked process that does what the test sends: 'hold' (enter and stay busy),
    'release', 'batch' (one hold, answering its threads and torch's), 'strict'
    (a batch that lends only after an hour idle)."""
    import torch

    held = None
    for command in iter(conn.recv, "stop"):
        if command in ("hold", "busy"):
            # busy: a request in hand, between batches (its hub at work), no torch change
            held = lending.hold() if command == "hold" else lending.busy()
            conn.send(held.__enter__())
        elif command == "release":
            assert held is not None
            held.__exit__(None, None, None)
            conn.send("released")
        elif command in ("batch", "strict"):
            lend_after_s = threads.LEND_AFTER_S
            if command == "strict":
                threads.LEND_AFTER_S = 3600.0
            with lending.hold() as lent:
                conn.send((lent, torch.get_num_threads()))
            threads.LEND_AFTER_S = lend_after_s


class Child:
    def __init__(self, lending: threads.CoreLending) -> None:
        self.conn, theirs = FORK.Pipe()
        self.process = FORK.Process(target=_child, args=(lending, theirs), daemon=True)
        self.process.start()

    def ask(self, command: str) -> Any:
        self.conn.send(command)
        assert self.conn.poll(30), f"the child did not answer {command!r}"
        return self.conn.recv()

    def stop(self) -> None:
        if self.process.is_alive():
            self.conn.send("stop")
            self.process.join(10)


# Linux's memfd, and the unlinked file of a system without one (macOS).
@pytest.fixture(params=["memfd", "unlinked file"])
def lending(request, monkeypatch):
    if request.param == "unlinked file":
        monkeypatch.delattr(os, "memfd_create")
    made = threads.CoreLending(processes=2, share=1, cores=2)
    children: list[Child] = []

    def child() -> Child:
        children.append(Child(made))
        return children[-1]

    yield made, child
    for one in children:
        one.stop()


def test_a_lone_batch_borrows_an_idle_peers_core_and_runs_torch_on_it(lending):
    _, child = lending
    peer, borrower = child(), child()
    peer.ask("hold")
    peer.ask("release")  # claimed its slot, now idle
    time.sleep(IDLE_LONG_ENOUGH_S)
    assert borrower.ask("batch") == (2, 2)


def test_a_busy_peer_lends_nothing(lending):
    _, child = lending
    peer, borrower = child(), child()
    assert peer.ask("hold") == 1  # alone, but the borrower has no slot yet: nobody idle
    assert borrower.ask("batch") == (1, 1)
    peer.ask("release")
    # Idle only a moment (the next batch of a loaded peer): not lent.
    assert borrower.ask("strict") == (1, 1)


def test_a_peer_with_a_request_in_hand_lends_nothing_between_its_batches(lending):
    _, child = lending
    peer, borrower = child(), child()
    peer.ask("busy")  # joined, then a request in hand and no batch running
    time.sleep(IDLE_LONG_ENOUGH_S)
    assert borrower.ask("batch") == (1, 1)
    peer.ask("release")
    time.sleep(IDLE_LONG_ENOUGH_S)
    assert borrower.ask("batch") == (2, 2)


def test_a_peer_killed_while_busy_is_replaced_and_its_slot_taken_over(lending):
    made, child = lending
    dead, borrower = child(), child()
    dead.ask("hold")
    os.kill(dead.process.pid, signal.SIGKILL)
    dead.process.join(10)
    assert borrower.ask("batch") == (1, 1)  # its slot still says busy: nothing lent
    successor = child()
    successor.ask("hold")
    successor.ask("release")
    time.sleep(IDLE_LONG_ENOUGH_S)
    assert borrower.ask("batch") == (2, 2)
    # The successor took the dead one's slot rather than a new one.
    assert list(made._owners).count(successor.process.pid) == 1
    assert dead.process.pid not in list(made._owners)


def test_the_master_never_claims_a_slot(lending):
    made, child = lending
    before = torch_threads()
    with made.hold() as lent:
        assert lent == 1
    assert torch_threads() == before  # the master's torch is left as it is
    assert not any(made._owners)
    borrower = child()
    time.sleep(IDLE_LONG_ENOUGH_S)
    assert borrower.ask("batch") == (1, 1)  # the master is no idle peer


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def test_nothing_is_lent_to_one_process_or_when_it_has_every_core_already():
    threads.lend_idle_cores(1, cores=4)
    assert threads._lending is None
    assert threads.most_threads() is None
    threads.lend_idle_cores(4, cores=2)  # a share of one core each: lent up to 2
    lending = threads._lending
    assert lending is not None
    assert (lending.share, lending.cores) == (1, 2)
    assert threads.most_threads() == 2
    threads.lend_idle_cores(3, cores=4)  # every peer idle: 3 shares of one, not 4 cores
    assert threads.most_threads() == 3
    threads.share_idle_cores(Settings.from_env({"SERVING_LEND_CORES": "false"}), 2, cores=2)
    assert threads._lending is None
    assert threads.most_threads() is None


# -- end to end ----------------------------------------------------------------

needs_two_cores = pytest.mark.skipif(usable_cores() < 2, reason="lending needs two cores")


def lone_requests(url: str, count: int = 5) -> list[int]:
    time.sleep(IDLE_LONG_ENOUGH_S)  # the other worker's warm-up is long over
    with requests.Session() as session:  # one connection: one worker, the other idle
        return [
            session.post(url + "/predict", json={}, timeout=60).json()["threads"]
            for _ in range(count)
        ]


@pytest.mark.e2e
@needs_two_cores
@pytest.mark.parametrize("lend", ["true", "false"])
def test_a_lone_request_runs_on_the_idle_workers_cores_too(lend):
    env = {"SERVING_HANDLER": FORKWARM, "SERVING_WORKERS": "2", "SERVING_LEND_CORES": lend}
    share = usable_cores() // 2
    # The start-up log says what a worker may borrow, and nothing when lending is off.
    lent = f", up to {2 * share} while its siblings idle" if lend == "true" else ""
    ready = re.compile(rf"worker \d+ ready: {share} torch thread\(s\){re.escape(lent)}$", re.M)
    with gunicorn_server(env) as server:
        answered = lone_requests(server.url)
        wait_for(lambda: len(ready.findall(server.output())) == 2, server.output, 60)
    assert answered == [2 * share if lend == "true" else share] * 5


@pytest.mark.e2e
@needs_two_cores
def test_a_lone_job_runs_on_the_idle_consumers_cores_too(tmp_path: Path):
    env = {
        "SERVING_HANDLER": FORKWARM,
        "SERVING_WORKERS": "2",
        "SERVING_JOBS_PATH": str(tmp_path / "jobs.db"),
    }
    queue = open_queue(Settings.from_env(env), "forkwarm")
    with job_worker(env, tmp_path):
        for _ in range(3):
            # One at a time, each after the last one's consumer has idled long
            # enough to lend (whichever consumer takes it, its peer is idle).
            time.sleep(SETTLE_S)
            job_id = queue.submit({}).id
            assert wait_for(result_of(queue, job_id), f"job {job_id}", 60)["threads"] == 2 * (
                usable_cores() // 2
            )


def result_of(queue: Any, job_id: str) -> Callable[[], Any]:
    def result() -> Any:
        job = queue.get(job_id)
        return job.result if job is not None else None

    return result
