"""A model failure's items run again alone (``loops.isolation.isolate``), over a real
``Engine``: how many runs, and which batches are left as they are."""

from __future__ import annotations

from typing import Any

import pytest

from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.errors import ServingError
from serving_core.loops.isolation import isolate
from tests.loops.flaky import Flaky


@pytest.mark.parametrize(
    ("params", "max_runs", "min_failures", "batches", "runs"),
    [
        # Each failure alone until it succeeds: the flaky one's second run does.
        ([{"n": 1}, {"n": 2, "flaky": True}], 3, 1, [[1, 2], [1], [2]], [2, 2]),
        # A poison item runs until max_runs, the batch's run counted.
        ([{"n": 1, "poison": True}], 3, 1, [[1], [1], [1]], [3]),
        # Fewer failures than min_failures: nothing runs again.
        ([{"n": 1, "poison": True}], 2, 2, [[1]], [1]),
        ([{"n": 1}, {"n": 2, "poison": True}], 2, 2, [[1, 2], [1], [2]], [2, 2]),
        # Nothing failed: nothing runs again.
        ([{"n": 1}, {"n": 2}], 3, 1, [[1, 2]], [1, 1]),
    ],
)
def test_a_model_failures_items_run_again_alone(
    params: list[dict[str, Any]],
    max_runs: int,
    min_failures: int,
    batches: list[list[int]],
    runs: list[int],
) -> None:
    handler = Flaky()
    engine = Engine(handler, max_batch_size=8)
    contexts = [Context(str(p["n"])) for p in params]
    first = engine.predict_many(params, contexts)
    results, ran = isolate(
        engine, params, contexts, first, max_runs=max_runs, min_failures=min_failures
    )
    assert handler.batches == batches
    assert ran == runs
    poisoned = [bool(p.get("poison")) for p in params]
    assert [isinstance(r, ServingError) for r in results] == poisoned
