from __future__ import annotations

import threading
import time

import pytest

from serving_core.context import Context
from serving_core.engine.batcher import Batcher
from serving_core.engine.costmodel import CostModel
from serving_core.engine.engine import Engine
from serving_core.engine.policy import FixedWindow, make_policy
from serving_core.errors import DeadlineExceeded, InvalidParams, ModelError, NotReady, Overloaded
from serving_core.handler import Handler, InvalidInput


class Model:
    """A fake handler that records the batches it sees; can be held to fill the queue."""

    def __init__(self, fail_on=None):
        self.batches: list[list] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_on = fail_on

    def __call__(self, items):
        self.entered.set()
        self.gate.wait(10)
        self.batches.append(list(items))
        if any(item == "bad" for item in items):
            raise InvalidInput(f"item is bad (batch of {len(items)})")
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError("boom")
        return [{"out": item} for item in items]


def run_with(model):
    """The engine's run over a handler whose predict_batch is ``model``."""

    class Fake(Handler):
        def predict_batch(self, items):
            return model(items)

    return Engine(Fake(), max_batch_size=4096).run


def make(model, *, max_batch_size=4, max_queue=8, max_wait_ms=50.0, policy="fixed"):
    batcher = Batcher(
        run_with(model),
        policy=make_policy(policy, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms),
        max_batch_size=max_batch_size,
        max_queue=max_queue,
    )
    batcher.start()
    return batcher


def submit(batcher, item, timeout_s=5.0):
    now = time.monotonic()
    return batcher.submit(item, Context(f"r-{item}", now + timeout_s), arrival=now)


@pytest.fixture
def model():
    return Model()


def test_two_simultaneous_requests_reach_the_handler_as_one_batch(model):
    batcher = make(model, max_wait_ms=500)
    try:
        barrier = threading.Barrier(2)
        results = {}

        def client(item):
            barrier.wait()
            results[item] = submit(batcher, item).future.result(5)

        threads = [threading.Thread(target=client, args=(i,)) for i in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {"a": {"out": "a"}, "b": {"out": "b"}}
        assert sorted(model.batches[0]) == ["a", "b"]
    finally:
        batcher.stop(5)


def test_batches_never_exceed_the_maximum_and_keep_order(model):
    model.gate.clear()
    batcher = make(model, max_batch_size=2, max_queue=8)
    try:
        first = submit(batcher, 0)
        assert model.entered.wait(5)
        pendings = [first] + [submit(batcher, i) for i in range(1, 6)]
        model.gate.set()
        assert [p.future.result(5) for p in pendings] == [{"out": i} for i in range(6)]
        assert model.batches == [[0], [1, 2], [3, 4], [5]]
    finally:
        batcher.stop(5)


# Batched, and unbatched (a batch of one each: those never wake the model thread early).
@pytest.mark.parametrize("max_batch_size", [4, 1])
def test_submits_before_a_deferred_wake_share_it(model, max_batch_size):
    # The gevent worker's case: the requests of one turn of the hub's loop wake the
    # model thread once, when the hub runs the scheduled callback.
    deferred = []
    batcher = make(model, max_batch_size=max_batch_size, policy="adaptive")
    batcher.defer_wake = deferred.append
    try:
        pendings = [submit(batcher, i) for i in range(3)]
        assert len(deferred) == 1
        deferred.pop()()
        assert [p.future.result(5) for p in pendings] == [{"out": i} for i in range(3)]
        fourth = submit(batcher, 3)
        assert len(deferred) == 1  # once run, the next submit schedules another
        deferred.pop()()
        assert fourth.future.result(5) == {"out": 3}
    finally:
        batcher.stop(5)


def test_a_full_batch_wakes_the_model_thread_without_waiting_for_the_deferred_wake(model):
    deferred = []
    # A 10 s window: a model thread that saw the first item waits for the second
    # (or for 10 s, past the results' timeout, if nothing woke it).
    batcher = make(model, max_batch_size=2, max_wait_ms=10_000)
    batcher.defer_wake = deferred.append
    try:
        pendings = [submit(batcher, i) for i in range(2)]
        # The hub's turn has not ended (the deferred wake never runs here).
        assert [p.future.result(5) for p in pendings] == [{"out": 0}, {"out": 1}]
        assert len(deferred) == 1
    finally:
        batcher.stop(5)


def test_the_policy_hears_when_each_batch_has_ended(model):
    batcher = make(model)
    ended: list[tuple[float, bool]] = []
    policy = batcher.policy
    pending: list = []

    def answered(now):
        ended.append((now, all(p.future.done() for p in pending)))
        type(policy).answered(policy, now)

    policy.answered = answered
    try:
        before = time.monotonic()
        model.gate.clear()  # the batch ends only once its pending is known here
        pending.append(submit(batcher, "a"))
        model.gate.set()
        assert pending[0].future.result(5) == {"out": "a"}
        deadline = time.monotonic() + 5
        while not ended and time.monotonic() < deadline:
            time.sleep(0.001)
        # once, after its item had its answer, and on the batcher's clock
        assert len(ended) == 1
        assert ended[0][1]
        assert before <= ended[0][0] <= time.monotonic()
    finally:
        batcher.stop(5)


def test_a_full_queue_refuses_at_once_with_a_retry_delay(model):
    model.gate.clear()
    batcher = make(model, max_batch_size=2, max_queue=2)
    try:
        submit(batcher, "running")
        assert model.entered.wait(5)
        submit(batcher, 1)
        submit(batcher, 2)
        # The model stays held: a submit that waited for room would never return.
        with pytest.raises(Overloaded) as info:
            submit(batcher, 3)
        assert info.value.reason == "queue_full"
        assert info.value.retry_after_s is not None
    finally:
        model.gate.set()
        batcher.stop(5)


def test_an_item_past_its_deadline_never_reaches_the_handler(model):
    model.gate.clear()
    batcher = make(model, max_batch_size=4)
    try:
        submit(batcher, "running")
        assert model.entered.wait(5)
        now = time.monotonic()
        late = batcher.submit("late", Context("late", now + 0.05), arrival=now)
        in_time = submit(batcher, "in-time")
        while time.monotonic() <= now + 0.05:  # until its deadline has passed
            time.sleep(0.01)
        model.gate.set()
        with pytest.raises(DeadlineExceeded, match="waited past its deadline"):
            late.future.result(5)
        assert in_time.future.result(5) == {"out": "in-time"}
        assert all("late" not in batch for batch in model.batches)
    finally:
        batcher.stop(5)


def test_a_cancelled_item_is_skipped(model):
    model.gate.clear()
    batcher = make(model)
    try:
        submit(batcher, "running")
        assert model.entered.wait(5)
        gone = submit(batcher, "gone")
        assert gone.future.cancel()
        kept = submit(batcher, "kept")
        model.gate.set()
        assert kept.future.result(5) == {"out": "kept"}
        assert all("gone" not in batch for batch in model.batches)
    finally:
        batcher.stop(5)


def test_invalid_input_fails_only_its_item(model):
    model.gate.clear()
    batcher = make(model, max_batch_size=4)
    try:
        submit(batcher, "running")
        assert model.entered.wait(5)
        pendings = [submit(batcher, item) for item in ("a", "bad", "c", "d")]
        model.gate.set()
        with pytest.raises(InvalidParams, match="item is bad"):
            pendings[1].future.result(5)
        assert [pendings[i].future.result(5) for i in (0, 2, 3)] == [
            {"out": "a"},
            {"out": "c"},
            {"out": "d"},
        ]
        # The batch of four was halved until the bad item stood alone.
        assert ["bad"] in model.batches
    finally:
        batcher.stop(5)


def test_an_error_fails_its_batch_and_the_next_batch_runs():
    model = Model(fail_on="boom")
    model.gate.clear()
    batcher = make(model, max_batch_size=2)
    try:
        submit(batcher, "running")
        assert model.entered.wait(5)
        failed = [submit(batcher, "boom"), submit(batcher, "x")]
        model.gate.set()
        for pending in failed:
            with pytest.raises(ModelError, match=f"request id {pending.request_id}"):
                pending.future.result(5)
        assert submit(batcher, "after").future.result(5) == {"out": "after"}
    finally:
        batcher.stop(5)


def test_stop_finishes_queued_items_then_refuses_new_ones(model):
    model.gate.clear()
    batcher = make(model)
    submit(batcher, "running")
    assert model.entered.wait(5)
    queued = submit(batcher, "queued")
    stopper = threading.Thread(target=batcher.stop, args=(5,))
    stopper.start()
    deadline = time.monotonic() + 5
    while batcher.alive and time.monotonic() < deadline:  # until stop() took effect
        time.sleep(0.005)
    with pytest.raises(NotReady):
        submit(batcher, "too-late")
    model.gate.set()
    stopper.join()
    assert queued.future.result(5) == {"out": "queued"}
    assert not batcher.alive


def test_the_fixed_window_waits_for_the_first_items_deadline(model):
    batcher = make(model, max_wait_ms=150)
    try:
        started = time.monotonic()
        pending = submit(batcher, "alone")
        pending.future.result(5)
        assert time.monotonic() - started >= 0.14
    finally:
        batcher.stop(5)


def test_a_failing_observer_fails_its_batch_but_not_the_model_thread(model):
    class Broken:
        def batch(self, size, duration_s, queue_waits_s):
            raise OSError("disk full")

        def rejected(self, reason):
            pass

        def failed(self, size):
            pass

        def depth(self, depth):
            pass

        def flush(self):
            pass

        def flush_in(self):
            return None

    batcher = Batcher(
        run_with(model),
        policy=make_policy("fixed", max_batch_size=4, max_wait_ms=0),
        max_batch_size=4,
        max_queue=8,
        observer=Broken(),
    )
    batcher.start()
    try:
        first = submit(batcher, "a")
        # Its result was set before the observer failed: the client still gets it.
        assert first.future.result(5) == {"out": "a"}
        assert batcher.alive
        assert submit(batcher, "b").future.result(5) == {"out": "b"}
    finally:
        batcher.stop(5)


def test_a_request_that_gives_up_leaves_the_queue_at_once(model):
    model.gate.clear()
    batcher = make(model, max_batch_size=1, max_queue=2)
    try:
        submit(batcher, "running")
        assert model.entered.wait(5)
        gone = submit(batcher, "gone")
        submit(batcher, "kept")
        assert batcher.depth == 2
        batcher.withdraw(gone)
        # Room for a new request while the batch in flight still runs.
        assert batcher.depth == 1
        assert gone.future.cancelled()
        submit(batcher, "new")
    finally:
        model.gate.set()
        batcher.stop(5)
    assert all("gone" not in batch for batch in model.batches)


@pytest.mark.parametrize("exit_", [SystemExit(3), KeyboardInterrupt()])
def test_a_base_exception_from_the_handler_fails_its_batch_not_the_model_thread(exit_):
    class Exiting:
        def __call__(self, items):
            if "exit" in items:
                raise exit_
            return [{"out": item} for item in items]

    batcher = make(Exiting(), max_batch_size=1, max_wait_ms=0)
    try:
        with pytest.raises(ModelError, match="request id r-exit"):
            submit(batcher, "exit").future.result(5)
        assert submit(batcher, "after").future.result(5) == {"out": "after"}
        # Served, but asking for the worker to be replaced.
        assert batcher.recycle == f"the handler raised {type(exit_).__name__}"
        assert not batcher.alive
        assert batcher.stalled(time.monotonic(), 0.0) is None
    finally:
        batcher.stop(5)


def test_an_error_in_forming_batches_fails_the_queue_loudly_and_names_the_fault(caplog):
    class BrokenPolicy(FixedWindow):
        def dispatch_at(self, queue, now):
            raise ZeroDivisionError("policy bug")

    batcher = Batcher(
        run_with(Model()),
        policy=BrokenPolicy(max_batch_size=4, max_wait_s=0.0, cost=CostModel()),
        max_batch_size=4,
        max_queue=8,
    )
    batcher.start()
    pending = submit(batcher, "a")
    with pytest.raises(NotReady, match="being replaced"):
        pending.future.result(5)
    with pytest.raises(NotReady):
        submit(batcher, "b")
    assert "policy bug" in batcher.stalled(time.monotonic(), margin_s=0.0)
    assert not batcher.alive
    assert any(r.levelname == "CRITICAL" and "policy bug" in r.getMessage() for r in caplog.records)


def test_a_batch_past_its_deadline_and_the_margin_is_stalled_and_abandon_fails_the_queue():
    model = Model()
    model.gate.clear()
    batcher = make(model, max_batch_size=1)
    try:
        now = time.monotonic()
        running = batcher.submit("running", Context("hung", now + 1.0), arrival=now)
        assert model.entered.wait(5)
        queued = submit(batcher, "queued")
        assert batcher.stalled(now + 1.5, margin_s=1.0) is None
        reason = batcher.stalled(now + 2.5, margin_s=1.0)
        assert "past its deadline" in reason
        assert "request ids: hung" in reason
        batcher.abandon(reason)
        for pending in (running, queued):
            with pytest.raises(NotReady, match="being replaced"):
                pending.future.result(0)
        assert batcher.depth == 0
        with pytest.raises(NotReady):
            submit(batcher, "new")
        # stop() does not wait for a model thread that may never return.
        assert batcher.stop(30) is False
    finally:
        model.gate.set()
    # If the handler does come back, its late result is dropped quietly.
    deadline = time.monotonic() + 5
    while batcher._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert model.batches == [["running"]]
