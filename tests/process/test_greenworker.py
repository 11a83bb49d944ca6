"""GreenFuture: set on the native model thread, awaited by greenlets without blocking the hub.

No monkey-patching here: the test process's main thread runs a gevent hub, and
``threading`` makes native threads, as in the gevent worker.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout

import gevent
import gevent.pool
import pytest
from gevent.event import Event

from serving_core.context import Context
from serving_core.engine.batcher import Batcher
from serving_core.engine.engine import Ran
from serving_core.engine.policy import make_policy
from serving_core.process.workers import clientwatch, fairaccept
from serving_core.process.workers.fairaccept import ConnectionShares, FairServer
from serving_core.process.workers.greenfuture import GreenFuture


@pytest.fixture(autouse=True)
def fresh_loop_time():
    """The hub's timers count from the loop's cached time, which is as old as the
    hub's last turn: after other tests' seconds without one, a 10 s timeout would
    fire at once. Bring it to now."""
    gevent.get_hub().loop.update_now()


def resolve_later(future, delay_s, value=None, exc=None):
    def run():
        time.sleep(delay_s)  # native sleep, on a native thread
        if future.set_running_or_notify_cancel():
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(value)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_greenlet_waits_for_a_native_thread_while_other_greenlets_run():
    future = GreenFuture()
    ticks = []
    ticked = threading.Event()

    def ticker():
        while not future.done():
            ticks.append(time.monotonic())
            if len(ticks) >= 5:
                ticked.set()
            gevent.sleep(0.001)

    def resolve():
        # The native thread answers only once the hub has run the ticker five times
        # while the greenlet waits; a wait that blocked the hub would hold it to 5 s.
        ticked.wait(5)
        future.set_result(42)

    ticking = gevent.spawn(ticker)
    thread = threading.Thread(target=resolve)
    thread.start()
    assert future.result(timeout=10) == 42
    ticking.join(1)
    thread.join()
    assert ticked.is_set(), "the hub ran no other greenlet while this one waited"


def test_an_exception_set_on_the_model_thread_is_raised_in_the_greenlet():
    future = GreenFuture()
    thread = resolve_later(future, 0.05, exc=ValueError("bad item"))
    with pytest.raises(ValueError, match="bad item"):
        future.result(timeout=5)
    thread.join()


def test_every_greenlet_waiting_on_one_future_wakes_when_it_is_set():
    # The cache's single flight hands one future to every identical request; with
    # one waiter slot, all but the last waiter slept until their timeout.
    future = GreenFuture()
    woken = []

    def wait(n):
        woken.append((n, future.result(timeout=30)))

    waiting = [gevent.spawn(wait, n) for n in range(5)]
    green_wait_until(lambda: len(future.waiters or ()) == 5)  # all in result() first
    thread = resolve_later(future, 0, value="shared")
    gevent.joinall(waiting, timeout=10)
    thread.join()
    assert sorted(woken) == [(n, "shared") for n in range(5)]
    assert future.waiters == []


def test_a_timed_out_wait_raises_and_cancel_keeps_the_model_thread_from_running_it():
    future = GreenFuture()
    returned = threading.Event()

    def rescue():
        # Only a guard against a hang: a wait that ignored its timeout gets a result
        # (and the test fails: no TimeoutError) instead of blocking forever.
        if not returned.wait(30):
            future.set_result("the wait ignored its timeout")

    rescuer = threading.Thread(target=rescue)
    rescuer.start()
    try:
        with pytest.raises(FutureTimeout):
            future.result(timeout=0.05)
    finally:
        returned.set()
        rescuer.join()
    assert future.cancel()
    assert not future.set_running_or_notify_cancel()
    with pytest.raises(CancelledError):
        future.result(timeout=0)


def test_a_clients_hang_up_is_seen_once_its_request_has_waited_a_moment():
    mine, theirs = socket.socketpair()
    gone = []
    started = time.monotonic()
    gevent.get_hub().loop.update_now()  # as fresh_loop_time does, after `started`
    stop = clientwatch.watch_client(mine, lambda: gone.append(time.monotonic() - started)).stop
    theirs.close()
    try:
        deadline = time.monotonic() + 5
        while not gone and time.monotonic() < deadline:
            gevent.sleep(0.005)
        # Not at once (no watcher for a request answered within WATCH_AFTER_S), but then.
        # (The hub's timers count from the loop's cached time: a few ms early.)
        assert gone
        assert gone[0] >= clientwatch.WATCH_AFTER_S / 2
    finally:
        stop()
        mine.close()


def test_a_request_answered_before_the_watch_starts_never_watches_its_client():
    mine, theirs = socket.socketpair()
    gone = []
    stop = clientwatch.watch_client(mine, lambda: gone.append(True)).stop
    stop()  # answered at once
    theirs.close()
    gevent.sleep(clientwatch.WATCH_AFTER_S * 3)
    assert gone == []
    mine.close()


def test_greenlets_submit_to_a_batcher_and_get_their_own_answers():
    batches = []

    def run_batch(items):
        batches.append(len(items))
        time.sleep(0.02)
        return [item * 10 for item in items]

    batcher = Batcher(
        lambda items, contexts: Ran(run_batch(items), calls=1),
        policy=make_policy("fixed", max_batch_size=8, max_wait_ms=20.0),
        max_batch_size=8,
        max_queue=64,
    )
    batcher.new_future = GreenFuture
    batcher.start()
    try:

        def request(n):
            now = time.monotonic()
            pending = batcher.submit(n, Context(str(n), now + 5), arrival=now)
            return pending.future.result(timeout=5)

        greenlets = [gevent.spawn(request, n) for n in range(20)]
        gevent.joinall(greenlets, timeout=10, raise_error=True)
    finally:
        batcher.stop(5)
    assert [g.value for g in greenlets] == [n * 10 for n in range(20)]
    assert max(batches) > 1


def test_a_worker_is_full_when_one_more_would_put_it_above_an_equal_share():
    shares = ConnectionShares(2)
    shares.counts[0], shares.counts[1] = 1, 0
    assert shares.full(0)  # 2 of 2 would be above 1 of 2
    assert not shares.full(1)
    shares.counts[0], shares.counts[1] = 16, 16
    assert not shares.full(0)  # 17 of 33 is its share, rounded up
    shares.counts[0], shares.counts[1] = 16, 15
    assert shares.full(0)  # 17 of 32: wrk's 32 connections split 16/16, never 17/15
    assert not shares.full(1)


@pytest.mark.parametrize("slots", [2, 3, 4])
def test_some_worker_is_never_full_so_a_connection_always_has_a_taker(slots):
    shares = ConnectionShares(slots)
    for counts in itertools.product(range(6), repeat=slots):
        shares.counts[:] = counts
        assert not all(shares.full(slot) for slot in range(slots)), counts
        least = counts.index(min(counts))
        assert not shares.full(least), counts


def test_a_count_written_after_fork_is_seen_by_the_master_and_siblings():
    shares = ConnectionShares(2)
    pid = os.fork()
    if pid == 0:  # a worker writing its slot
        shares.counts[1] = 7
        os._exit(0)
    os.waitpid(pid, 0)
    assert list(shares.counts) == [0, 7]


def test_the_master_frees_a_dead_workers_slot_for_its_replacement():
    shares = ConnectionShares(2)
    first, second, replacement = object(), object(), object()
    assert (shares.claim(first), shares.claim(second)) == (0, 1)
    shares.counts[0] = 7
    shares.release(first)
    assert shares.counts[0] == 0
    assert shares.claim(replacement) == 0
    assert shares.claim(object()) is None  # more workers than slots: no balancing for it


def test_the_master_shares_out_slots_and_frees_a_dead_workers(monkeypatch):
    monkeypatch.setattr(fairaccept, "_shares", None)  # restored after the test
    first, second, replacement = object(), object(), object()
    fairaccept.share_connections(2)
    assert (fairaccept.claim_slot(first), fairaccept.claim_slot(second)) == (0, 1)
    fairaccept.worker_exited(first)
    assert fairaccept.claim_slot(replacement) == 0
    fairaccept.share_connections(1)  # one worker: nothing to balance
    assert fairaccept.claim_slot(object()) is None


def green_wait_until(condition, timeout_s=5.0):
    """Poll ``condition`` from a greenlet, letting the hub run the servers meanwhile."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        gevent.sleep(0.001)


@pytest.fixture
def fair_server(monkeypatch):
    """A FairServer in slot 0 of two, whose worker already holds 5 connections.

    ``connect`` opens client connections with plain blocking sockets: the kernel
    completes them into the listener's backlog while the hub does not run, so
    several at once arrive as one burst, as when a hub is busy elsewhere."""
    shares = ConnectionShares(2)
    shares.counts[0] = 5
    monkeypatch.setattr(fairaccept, "_shares", shares)
    accepted = []
    hang_up = Event()

    def handle(sock, addr):
        accepted.append(1)
        hang_up.wait(10)  # the connection stays open, and counted, until the test ends

    server = FairServer(("127.0.0.1", 0), handle=handle)
    server.slot = 0
    server.start()
    clients = []
    before = FairServer.open_connections

    def connect(count=1):
        clients.extend(socket.create_connection(server.address) for _ in range(count))

    yield shares, accepted, connect, server
    hang_up.set()
    for client in clients:
        client.close()
    # Every connection closed (and uncounted) before the next test's shares are set.
    green_wait_until(lambda: FairServer.open_connections == before)
    server.stop()


def test_a_full_server_leaves_a_burst_to_its_sibling(fair_server, monkeypatch):
    # The pause cannot run out during the test, however slowly it is scheduled.
    monkeypatch.setattr(fairaccept, "ACCEPT_PAUSE_MAX_S", 3600.0)
    shares, accepted, connect, server = fair_server
    connect(3)  # one burst, all in the backlog before the hub looks
    green_wait_until(lambda: server.paused)
    # Let the hub run its accept loop and the pause's timer a few times: nothing is
    # taken while 5 + 1 > an equal share of 6 (gevent's loop would take the whole
    # burst at once; with "an equal share plus one" it took one first).
    for _ in range(3):
        gevent.sleep(fairaccept.ACCEPT_PAUSE_S)
    assert accepted == [], "accepted while full"
    assert (shares.counts[0], shares.counts[1]) == (5, 0)
    shares.counts[1] = 6  # the sibling took its share, and one more
    # Resumed: takes one to 6 of 12, another to 7 of 13, and stops before 8 of 14.
    green_wait_until(lambda: len(accepted) == 2 and server.paused)
    for _ in range(3):
        gevent.sleep(fairaccept.ACCEPT_PAUSE_S)
    assert len(accepted) == 2, "took one past an equal share"
    assert (shares.counts[0], shares.counts[1]) == (7, 6)
    shares.counts[1] = 7  # its sibling caught up: the last of the burst is taken
    green_wait_until(lambda: len(accepted) == 3)


def test_a_server_within_its_share_takes_a_whole_burst(fair_server):
    shares, accepted, connect, server = fair_server
    shares.counts[1] = 10  # the sibling leads
    connect(3)
    green_wait_until(lambda: len(accepted) == 3)
    assert not server.paused
    assert shares.counts[0] == 8


def test_a_server_resumes_accepting_when_its_sibling_never_does(fair_server, monkeypatch):
    shares, accepted, connect, server = fair_server
    connect()
    # Full (the sibling holds none), yet it takes the connection once
    # ACCEPT_PAUSE_MAX_S has passed.
    green_wait_until(lambda: len(accepted) == 1)
    assert shares.full(0)
    # Once a pause runs out with nothing pending, accepting goes on as usual; the
    # next connection is offered to the sibling first again (now for as long as
    # it takes), not let through because a pause once ran out.
    green_wait_until(lambda: not server.paused)
    monkeypatch.setattr(fairaccept, "ACCEPT_PAUSE_MAX_S", 3600.0)
    connect()
    green_wait_until(lambda: server.paused)
    for _ in range(3):
        gevent.sleep(fairaccept.ACCEPT_PAUSE_S)
    assert len(accepted) == 1, "a pause that ran out let a later connection straight in"


def test_a_pause_that_runs_out_waits_for_a_free_greenlet_when_the_pool_is_full(monkeypatch):
    # gunicorn's gevent worker spawns through a Pool of worker_connections: a
    # connection taken when a pause runs out must wait for a free greenlet as
    # gevent's accept loop does, not block the hub in the pause's timer (which
    # left the listener stopped for good).
    shares = ConnectionShares(2)
    shares.counts[0] = 5  # full: its sibling holds none and never takes any
    monkeypatch.setattr(fairaccept, "_shares", shares)
    release = Event()
    accepted = []

    def handle(sock, addr):
        accepted.append(1)
        release.wait(10)

    server = FairServer(("127.0.0.1", 0), handle=handle, spawn=gevent.pool.Pool(1))
    server.slot = 0
    server.start()
    before = FairServer.open_connections
    clients = [socket.create_connection(server.address) for _ in range(2)]
    try:
        green_wait_until(lambda: len(accepted) == 1)  # the pause ran out: one taken
        for _ in range(3):  # pauses run out again while the pool's one greenlet is busy
            gevent.sleep(fairaccept.ACCEPT_PAUSE_MAX_S)
        assert len(accepted) == 1
        release.set()  # the greenlet is free: the second connection is taken
        green_wait_until(lambda: len(accepted) == 2)
    finally:
        release.set()
        for client in clients:
            client.close()
        green_wait_until(lambda: FairServer.open_connections == before)
        server.stop()


def test_the_server_counts_its_open_connections_for_the_batcher():
    release = Event()
    server = FairServer(("127.0.0.1", 0), handle=lambda sock, addr: release.wait(5))
    server.start()
    before = FairServer.open_connections
    try:
        clients = [socket.create_connection(server.address) for _ in range(3)]
        green_wait_until(lambda: FairServer.open_connections == before + 3)
        release.set()
        green_wait_until(lambda: FairServer.open_connections == before)
        for client in clients:
            client.close()
    finally:
        server.stop()
