"""Clients that hang up while queued: swept out before a refusal, never run.

The hang-up is noticed by the gevent worker's real client watch
(``clientwatch.watch_client``) on socket pairs whose client end closes; the test
process's main thread runs the hub, as a gevent worker's does.
"""

from __future__ import annotations

import socket
import time
from functools import partial

import gevent
import pytest

from serving_core.engine.batcher import Batcher
from serving_core.errors import Overloaded
from serving_core.process.workers import clientwatch
from tests.engine.test_batcher import Model, make, submit


@pytest.fixture
def held():
    """A batcher (batches of 1, a queue of 4) whose model holds its first item."""
    model = Model()
    model.gate.clear()
    batcher = make(model, max_batch_size=1, max_queue=4)
    submit(batcher, "running")
    assert model.entered.wait(5)
    yield model, batcher
    model.gate.set()
    batcher.stop(5)


@pytest.fixture
def clients():
    """Queue items watched as a gevent worker watches them: ``watched(batcher, item)``
    submits it and returns its pending item and the client's end of the connection."""
    opened, stops = [], []

    def watched(batcher: Batcher, item: str):
        pending = submit(batcher, item)
        server, client = socket.socketpair()
        opened.extend((server, client))
        watching = clientwatch.watch_client(server, partial(batcher.hung_up, pending))
        pending.client_gone = watching.gone_now  # as the queued runner sets it
        stops.append(watching.stop)
        return pending, client

    yield watched
    for stop in stops:
        stop()
    for sock in opened:
        sock.close()


def green_wait_until(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        gevent.sleep(0.005)


def test_a_full_queue_of_hung_up_clients_does_not_refuse_a_newcomer(held, clients):
    model, batcher = held
    queued = [clients(batcher, f"gone-{n}") for n in range(4)]
    for _, client in queued:
        client.close()
    green_wait_until(lambda: all(pending.gone for pending, _ in queued))
    assert batcher.depth == 0  # marked (dropped when the room is needed)
    newcomer = submit(batcher, "newcomer")
    assert batcher.depth == 1
    assert all(pending.future.cancelled() for pending, _ in queued)
    model.gate.set()
    assert newcomer.future.result(5) == {"out": "newcomer"}
    assert [batch for batch in model.batches if batch[0].startswith("gone")] == []


def test_clients_that_hung_up_before_any_watch_saw_it_are_asked_before_a_refusal(held, clients):
    # A storm's last requests: queued a moment ago, their clients closed in the same
    # turn of the hub, so no watch has reported them. The refusal asks each socket.
    model, batcher = held
    queued = [clients(batcher, f"young-{n}") for n in range(4)]
    for _, client in queued:
        client.close()
    assert not any(pending.gone for pending, _ in queued)  # nobody has looked yet
    newcomer = submit(batcher, "newcomer")
    assert all(pending.future.cancelled() for pending, _ in queued)
    model.gate.set()
    assert newcomer.future.result(5) == {"out": "newcomer"}
    assert [batch for batch in model.batches if batch[0].startswith("young")] == []


def test_a_full_queue_of_live_clients_still_refuses(held, clients):
    _, batcher = held
    queued = [clients(batcher, f"live-{n}") for n in range(4)]
    with pytest.raises(Overloaded) as info:
        submit(batcher, "newcomer")
    assert info.value.reason == "queue_full"
    assert batcher.depth == 4
    assert not any(pending.future.done() for pending, _ in queued)


def test_one_hung_up_client_makes_room_for_one_newcomer(held, clients):
    _, batcher = held
    queued = [clients(batcher, f"item-{n}") for n in range(4)]
    queued[1][1].close()
    green_wait_until(lambda: queued[1][0].gone)
    submit(batcher, "first")
    with pytest.raises(Overloaded):
        submit(batcher, "second")
    assert [pending.future.cancelled() for pending, _ in queued] == [False, True, False, False]


def test_a_newcomer_predicted_late_behind_the_gone_is_admitted(held, clients):
    _, batcher = held
    for _ in range(3):
        batcher.policy.observe(1, 1.0)  # a batch of one takes a second
    queued = [clients(batcher, f"gone-{n}") for n in range(3)]
    with pytest.raises(Overloaded) as info:
        submit(batcher, "late", timeout_s=2.5)  # three seconds of queue ahead of it
    assert info.value.reason == "predicted_late"
    for _, client in queued:
        client.close()
    green_wait_until(lambda: all(pending.gone for pending, _ in queued))
    submit(batcher, "in time", timeout_s=2.5)
    assert batcher.depth == 1


def test_a_hung_up_item_the_model_reaches_first_is_dropped_unrun(held, clients):
    model, batcher = held
    pending, client = clients(batcher, "gone")
    kept = submit(batcher, "kept")
    client.close()
    green_wait_until(lambda: pending.gone)
    model.gate.set()
    assert kept.future.result(5) == {"out": "kept"}
    assert pending.future.cancelled()
    assert ["gone"] not in model.batches
