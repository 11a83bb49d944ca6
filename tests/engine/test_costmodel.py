from __future__ import annotations

import pytest

from serving_core.engine.costmodel import CostModel


def test_nothing_observed_predicts_zero():
    model = CostModel()
    assert not model.known
    assert model.predict(8) == 0.0


def test_a_linear_cost_is_recovered():
    model = CostModel()
    for size in (1, 2, 4, 8, 16):
        for _ in range(3):
            model.observe(size, 0.004 + 0.002 * size)
    assert model.predict(1) == pytest.approx(0.006)
    assert model.predict(32) == pytest.approx(0.068)
    described = model.describe()
    assert described["intercept_ms"] == pytest.approx(4.0)
    assert described["per_item_ms"] == pytest.approx(2.0)


def test_one_size_seen_scales_in_proportion():
    model = CostModel()
    model.observe(4, 0.02)
    assert model.predict(8) == pytest.approx(0.04)


def test_a_stray_slow_batch_moves_nothing():
    model = CostModel()
    for _ in range(10):
        model.observe(1, 0.010)
        model.observe(8, 0.024)
    before = (model.predict(1), model.predict(8))
    model.observe(8, 5.0)  # a GC pause, a noisy neighbour
    assert (model.predict(1), model.predict(8)) == pytest.approx(before)


def test_the_window_forgets_old_costs():
    model = CostModel(window=4)
    for _ in range(4):
        model.observe(2, 0.100)
    for _ in range(4):
        model.observe(2, 0.010)
    assert model.predict(2) == pytest.approx(0.010)


def test_a_negative_intercept_is_clamped_to_a_line_through_the_origin():
    model = CostModel()
    model.observe(1, 0.001)
    model.observe(10, 0.030)
    assert model.predict(0) == 0.0
    assert model.predict(1) > 0.0
    assert model.describe()["intercept_ms"] == 0.0


def test_reset_forgets_everything():
    model = CostModel()
    model.observe(1, 1.0)
    model.reset()
    assert not model.known
