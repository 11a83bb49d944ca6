"""Dispatch and admission decisions on a fake clock: no sleeps, no threads."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from serving_core.costmodel import CostModel
from serving_core.dispatch import Adaptive, ArrivalRate, FixedWindow


@dataclass
class Item:
    enqueued: float
    deadline: float


def linear_cost(intercept_s=0.010, per_item_s=0.005, sizes=(1, 4, 16)):
    cost = CostModel()
    for size in sizes:
        cost.observe(size, intercept_s + per_item_s * size)
    return cost


def adaptive(cost=None, max_batch_size=16, max_wait_s=0.050):
    return Adaptive(
        max_batch_size=max_batch_size, max_wait_s=max_wait_s, cost=cost or linear_cost()
    )


def arrivals(policy, times):
    for t in times:
        policy.arrived(t)


def test_the_fixed_window_runs_at_the_first_items_arrival_plus_the_window():
    policy = FixedWindow(max_batch_size=16, max_wait_s=0.005, cost=CostModel())
    queue = [Item(10.000, 20.0), Item(10.003, 20.0)]
    assert policy.dispatch_at(queue, now=10.004) == pytest.approx(10.005)


def test_adaptive_runs_at_once_when_it_knows_no_cost_yet():
    policy = adaptive(cost=CostModel())
    arrivals(policy, [0.0, 0.001, 0.002])
    assert policy.dispatch_at([Item(0.002, 10.0)], now=0.002) == 0.002


def test_adaptive_runs_at_once_at_low_load():
    policy = adaptive()
    arrivals(policy, [0.0, 0.1, 0.2, 0.3])  # 10/s, far below what batches of 1 serve
    assert policy.dispatch_at([Item(0.3, 10.3)], now=0.3) == 0.3


def test_adaptive_never_holds_an_idle_queue():
    policy = adaptive()
    arrivals(policy, [i * 0.001 for i in range(20)])  # a burst at 1000/s...
    # ...then silence: the rate seen now is low, so one item runs at once.
    assert policy.dispatch_at([Item(0.019, 10.0)], now=0.5) == 0.5


def test_adaptive_waits_when_arrivals_outpace_small_batches():
    policy = adaptive()
    arrivals(policy, [i * 0.001 for i in range(50)])  # 1000/s, batches of 1 serve ~67/s
    now = 0.049
    at = policy.dispatch_at([Item(now, now + 10.0)], now=now)
    assert now < at <= now + 0.050
    # the wait gathers about as many items as the batch size that keeps up needs
    target = policy._keeps_up_size(1, 1000.0)
    assert at - now == pytest.approx((target - 1) / 1000.0)


def test_adaptive_never_waits_past_a_queued_items_deadline():
    policy = adaptive()
    arrivals(policy, [i * 0.001 for i in range(50)])  # so fast that only 16 keeps up
    now = 0.049
    full_batch_s = policy.cost.predict(16)
    tight = Item(now, now + full_batch_s + 0.003)  # 3 ms to spare after a full batch
    assert policy.dispatch_at([tight], now=now) == pytest.approx(now + 0.003)
    too_tight = Item(now, now + full_batch_s - 0.001)
    assert policy.dispatch_at([too_tight], now=now) == now


def test_adaptive_never_waits_longer_than_max_wait():
    policy = adaptive(max_wait_s=0.002)
    arrivals(policy, [i * 0.01 for i in range(10)])  # 100/s against ~67/s at size 1
    now = 0.09
    assert policy.dispatch_at([Item(now, now + 10)], now=now) <= now + 0.002 + 1e-9


def test_a_full_batch_runs_at_once():
    policy = adaptive(max_batch_size=2)
    arrivals(policy, [i * 0.0001 for i in range(100)])
    queue = [Item(0.0099, 10.0), Item(0.0099, 10.0)]
    assert policy.dispatch_at(queue, now=0.0099) == 0.0099


def test_admission_accepts_what_can_finish_in_time():
    policy = adaptive()
    # 10 queued + this one: one batch of 11 = 10 ms + 55 ms, after 20 ms in flight
    assert policy.predicted_late(10, 0.020, deadline=1.0, now=0.0) is None


def test_admission_refuses_what_would_finish_late_with_an_honest_retry_after():
    policy = adaptive()
    retry_after = policy.predicted_late(40, 0.020, deadline=0.1, now=0.0)
    # The 40 queued drain in batches of 16, 16, 8 after the 20 ms in flight.
    assert retry_after == pytest.approx(0.020 + 2 * 0.090 + 0.050)


def test_admission_admits_everything_before_any_cost_is_known():
    policy = adaptive(cost=CostModel())
    assert policy.predicted_late(10_000, 0.0, deadline=0.001, now=0.0) is None


def test_the_arrival_rate_follows_the_gaps():
    rate = ArrivalRate()
    for i in range(100):
        rate.arrived(i * 0.01)
    assert rate.per_s(0.99) == pytest.approx(100.0, rel=0.01)
    assert rate.per_s(10.0) < 1.0  # long silence
