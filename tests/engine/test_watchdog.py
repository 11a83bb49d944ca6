from __future__ import annotations

import threading
import time

import pytest

from serving_core.context import Context
from serving_core.engine.batcher import Batcher
from serving_core.engine.policy import make_policy
from serving_core.engine.watchdog import Verdict, Watchdog, resident_bytes
from serving_core.errors import ModelError, NotReady
from tests.engine.test_batcher import Model, run_with


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


def batcher_over(model, clock, *, max_batch_size=1):
    batcher = Batcher(
        run_with(model),
        policy=make_policy("fixed", max_batch_size=max_batch_size, max_wait_ms=0),
        max_batch_size=max_batch_size,
        max_queue=8,
        clock=clock,
    )
    batcher.start()
    return batcher


def submit(batcher, clock, item, timeout_s):
    return batcher.submit(item, Context(f"r-{item}", clock.now + timeout_s), arrival=clock.now)


def never(verdict: Verdict) -> None:
    raise AssertionError(f"no verdict expected, got {verdict}")


def test_a_batch_hung_past_its_deadline_and_the_margin_is_an_urgent_verdict():
    clock = Clock()
    model = Model()
    model.gate.clear()
    batcher = batcher_over(model, clock)
    watchdog = Watchdog(batcher, hang_margin_s=2.0, max_rss_bytes=0, on_verdict=never, clock=clock)
    try:
        running = submit(batcher, clock, "hung", timeout_s=1.0)
        assert model.entered.wait(5)
        queued = submit(batcher, clock, "queued", timeout_s=60.0)
        clock.now += 2.9  # the batch's deadline plus less than the margin
        assert watchdog.check() is None
        clock.now += 0.2
        verdict = watchdog.check()
        assert verdict is not None
        assert verdict.urgent
        assert "past its deadline" in verdict.reason
        # The queue is given up at once: another worker can serve those requests.
        for pending in (running, queued):
            with pytest.raises(NotReady):
                pending.future.result(0)
        assert batcher.depth == 0
    finally:
        model.gate.set()
        batcher.stop(5)


def test_a_batch_that_is_slow_but_within_its_deadline_is_left_alone():
    clock = Clock()
    model = Model()
    model.gate.clear()
    batcher = batcher_over(model, clock)
    watchdog = Watchdog(batcher, hang_margin_s=0.0, max_rss_bytes=0, on_verdict=never, clock=clock)
    try:
        pending = submit(batcher, clock, "slow", timeout_s=10.0)
        assert model.entered.wait(5)
        clock.now += 9.0
        assert watchdog.check() is None
        model.gate.set()
        assert pending.future.result(5) == {"out": "slow"}
        clock.now += 100.0  # idle: nothing to be late for
        assert watchdog.check() is None
    finally:
        model.gate.set()
        batcher.stop(5)


def test_a_handler_that_raised_system_exit_gets_a_graceful_verdict_on_the_watchdog_thread():
    class Exiting:
        def __call__(self, items):
            raise SystemExit(0)

    batcher = Batcher(
        run_with(Exiting()),
        policy=make_policy("fixed", max_batch_size=1, max_wait_ms=0),
        max_batch_size=1,
        max_queue=8,
    )
    batcher.start()
    verdicts: list[Verdict] = []
    given = threading.Event()

    def on_verdict(verdict: Verdict) -> None:
        verdicts.append(verdict)
        given.set()

    watchdog = Watchdog(
        batcher, hang_margin_s=2.0, max_rss_bytes=0, on_verdict=on_verdict, interval_s=0.01
    )
    watchdog.start()
    try:
        now = time.monotonic()
        with pytest.raises(ModelError, match="request id r-x"):
            batcher.submit("x", Context("r-x", now + 5), arrival=now).future.result(5)
        assert given.wait(5)
        assert verdicts == [Verdict("the handler raised SystemExit", urgent=False)]
        assert watchdog.verdict == verdicts[0]
    finally:
        watchdog.stop()
        batcher.stop(5)


def test_resident_memory_past_the_ceiling_is_a_graceful_verdict():
    sizes = iter([100 * 2**20, 300 * 2**20])
    watchdog = Watchdog(
        None,
        hang_margin_s=2.0,
        max_rss_bytes=200 * 2**20,
        on_verdict=never,
        rss=lambda: next(sizes),
    )
    assert watchdog.check() is None
    verdict = watchdog.check()
    assert verdict == Verdict(
        "its resident memory (300 MiB) passed SERVING_MAX_RSS_BYTES (200 MiB)", urgent=False
    )


def test_resident_bytes_reads_this_process():
    rss = resident_bytes()
    assert rss is not None
    assert 10 * 2**20 < rss < 64 * 2**30
