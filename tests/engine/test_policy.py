"""Dispatch and admission decisions on a fake clock: no sleeps, no threads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import pytest

from serving_core.engine.costmodel import CostModel
from serving_core.engine.engine import Engine
from serving_core.engine.policy import (
    POLICIES,
    Adaptive,
    ArrivalGaps,
    FixedWindow,
    make_policy,
    policy_for,
)
from serving_core.handler import Handler
from serving_core.settings import BatchPolicy, Settings


@dataclass
class Item:
    enqueued: float
    deadline: float


def linear_cost(intercept_s=0.010, per_item_s=0.005, sizes=(1, 4, 16)):
    cost = CostModel()
    for size in sizes:
        cost.observe(size, intercept_s + per_item_s * size)
    return cost


def adaptive(cost=None, max_batch_size=16, max_wait_s=0.050, open_connections=lambda: None):
    return Adaptive(
        max_batch_size=max_batch_size,
        max_wait_s=max_wait_s,
        cost=cost or linear_cost(),
        open_connections=open_connections,
    )


def arrivals(policy, times):
    for t in times:
        policy.arrived(t)


def burst(policy, start=0.0, n=8, gap=0.0002):
    times = [start + i * gap for i in range(n)]
    arrivals(policy, times)
    return times[-1]


def test_the_fixed_window_runs_at_the_first_items_arrival_plus_the_window():
    policy = FixedWindow(max_batch_size=16, max_wait_s=0.005, cost=CostModel())
    queue = [Item(10.000, 20.0), Item(10.003, 20.0)]
    assert policy.dispatch_at(queue, now=10.004) == pytest.approx(10.005)


def test_adaptive_runs_at_once_when_it_knows_no_cost_yet():
    policy = adaptive(cost=CostModel())
    last = burst(policy)
    assert policy.dispatch_at([Item(last, 10.0)], now=last) == last


def test_adaptive_runs_at_once_when_arrivals_are_further_apart_than_a_batchs_fixed_cost():
    policy = adaptive()  # a = 10 ms
    arrivals(policy, [0.0, 0.02, 0.04, 0.06])  # one every 20 ms
    assert policy.dispatch_at([Item(0.06, 10.0)], now=0.06) == 0.06


def test_adaptive_waits_while_a_burst_keeps_coming():
    policy = adaptive()  # a = 10 ms: an arrival within 10 ms is worth waiting for
    last = burst(policy)
    queue = [Item(last - 0.001, 10.0), Item(last, 10.0)]
    assert policy.dispatch_at(queue, now=last) == pytest.approx(last + 0.010)


def test_adaptive_stops_waiting_once_the_burst_is_over():
    policy = adaptive(max_wait_s=1.0)
    last = burst(policy)
    assert policy.dispatch_at([Item(last, 10.0)], now=last + 0.011) == last + 0.011


def test_adaptive_runs_at_once_when_every_open_connection_has_sent():
    policy = adaptive(open_connections=lambda: 2)
    last = burst(policy)
    queue = [Item(last, 10.0), Item(last, 10.0)]
    assert policy.dispatch_at(queue, now=last) == last
    policy = adaptive(open_connections=lambda: 3)
    burst(policy)
    assert policy.dispatch_at(queue, now=last) > last


def test_adaptive_never_waits_past_a_queued_items_deadline():
    policy = adaptive()
    last = burst(policy)
    two_items_s = policy.cost.predict(2)
    tight = Item(last, last + two_items_s + 0.003)  # 3 ms to spare
    assert policy.dispatch_at([tight], now=last) == pytest.approx(last + 0.003)
    too_tight = Item(last, last + two_items_s - 0.001)
    assert policy.dispatch_at([too_tight], now=last) == last


def test_adaptive_never_waits_longer_than_max_wait():
    policy = adaptive(max_wait_s=0.002)
    last = burst(policy)
    assert policy.dispatch_at([Item(last, last + 10)], now=last) == pytest.approx(last + 0.002)


def test_after_a_batch_the_queue_built_during_it_waits_for_the_clients_just_answered():
    # Closed-loop clients at c=2x the batch: half the requests arrived while the
    # other half ran. When that batch ends, its clients are about to send again.
    policy = adaptive(open_connections=lambda: 16)  # a = 10 ms, max wait 50 ms
    last = burst(policy, n=8)
    queue = [Item(last, 10.0)] * 8
    ended = last + 0.040  # the batch ran 40 ms after the last arrival
    # Before the batch's end is known, 40 ms of silence reads as a slow rate: now.
    assert policy.dispatch_at(queue, now=ended) == ended
    policy.answered(ended)
    assert policy.dispatch_at(queue, now=ended) == pytest.approx(ended + 0.010)
    # An answered client's request arrives: the wait runs on from it.
    policy.arrived(ended + 0.002)
    assert policy.dispatch_at([*queue, Item(ended + 0.002, 10.0)], now=ended + 0.002) == (
        pytest.approx(ended + 0.012)
    )


def test_after_a_batch_the_wait_is_at_most_max_wait_from_its_end():
    policy = adaptive(open_connections=lambda: 16, max_wait_s=0.002)
    last = burst(policy, n=8)
    ended = last + 0.040
    policy.answered(ended)
    # max wait counts from when the model was free, not from the first item's arrival
    assert policy.dispatch_at([Item(last, 10.0)] * 8, now=ended) == pytest.approx(ended + 0.002)
    # and nobody waits past the end of it
    assert policy.dispatch_at([Item(last, 10.0)] * 8, now=ended + 0.003) == ended + 0.003


def test_a_full_batch_runs_at_once():
    policy = adaptive(max_batch_size=2)
    last = burst(policy)
    queue = [Item(last, 10.0), Item(last, 10.0)]
    assert policy.dispatch_at(queue, now=last) == last


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
    rate = ArrivalGaps()
    for i in range(100):
        rate.arrived(i * 0.01)
    assert rate.expected_gap_s(0.99) == pytest.approx(0.01, rel=0.01)
    assert rate.expected_gap_s(10.0) > 1.0  # long silence


def test_a_burst_after_a_pause_still_counts_as_fast():
    rate = ArrivalGaps()
    t = 0.0
    for _ in range(3):  # closed-loop clients: 16 arrivals within 1.5 ms, then 80 ms of work
        for _ in range(16):
            t += 0.0001
            rate.arrived(t)
        t += 0.080
    rate.arrived(t)  # the first of the next burst
    assert rate.expected_gap_s(t) <= 0.001


# --- which policy: SERVING_BATCH_POLICY's names and the engine's table -----------


def test_every_policy_name_the_settings_accept_has_a_policy_and_no_other():
    # Settings parses SERVING_BATCH_POLICY against BatchPolicy; POLICIES builds them.
    assert set(POLICIES) == set(get_args(BatchPolicy))
    assert {name: kind.name for name, kind in POLICIES.items()} == {n: n for n in POLICIES}


def test_an_unknown_policy_name_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="no batch policy 'greedy': use one of adaptive, fixed"):
        make_policy("greedy", max_batch_size=4, max_wait_ms=5)


class Batched(Handler):
    def predict_batch(self, items):
        return items


class Single(Handler):
    def predict(self, item):
        return item


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_for_builds_the_settings_policy_with_their_window(name):
    settings = Settings.from_env(
        {"SERVING_BATCH_POLICY": name, "SERVING_MAX_WAIT_MS": "7"}, cores=2
    )
    policy = policy_for(settings, Engine(Batched(), max_batch_size=8), open_connections=lambda: 3)
    assert type(policy) is POLICIES[name]
    assert (policy.max_batch_size, policy.max_wait_s) == (8, 0.007)


def test_policy_for_an_unbatched_handler_never_waits():
    settings = Settings.from_env({"SERVING_MAX_WAIT_MS": "7"}, cores=2)
    policy = policy_for(settings, Engine(Single(), max_batch_size=8), open_connections=lambda: 3)
    assert (policy.max_batch_size, policy.max_wait_s) == (1, 0.0)


def test_policy_for_follows_the_settings_default():
    settings = Settings.from_env({}, cores=2)
    policy = policy_for(settings, Engine(Batched(), max_batch_size=8), open_connections=lambda: 3)
    assert type(policy) is POLICIES[settings.batch_policy]


@pytest.mark.parametrize(("connections", "waits"), [(2, False), (3, True)])
def test_policy_for_hands_the_open_connections_to_the_adaptive_policy(connections, waits):
    settings = Settings.from_env({"SERVING_BATCH_POLICY": "adaptive"}, cores=2)
    engine = Engine(Batched(), max_batch_size=8)
    policy = policy_for(settings, engine, open_connections=lambda: connections)
    policy.cost = linear_cost()
    last = burst(policy)
    queue = [Item(last, 10.0), Item(last, 10.0)]
    assert (policy.dispatch_at(queue, now=last) > last) is waits
