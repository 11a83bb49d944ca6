"""Run a failed item again on its own: what both loops do after a model failure.

A model failure (a 5xx: the handler's ``predict_batch`` raised) fails every
item of its batch, the innocent with the guilty. Running each failed item
again alone lets one poison item fail by itself, so its batch-mates are not
retried with it until they too run out of attempts.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving_core.context import Context
from serving_core.engine.engine import Engine, Result
from serving_core.errors import ServingError
from serving_core.handler import Params


def model_failure(result: Result) -> bool:
    return isinstance(result, ServingError) and result.status >= 500


def isolate(
    engine: Engine,
    params: Sequence[Params],
    contexts: Sequence[Context],
    results: Sequence[Result],
    *,
    max_runs: int,
    min_failures: int = 1,
) -> tuple[list[Result], list[int]]:
    """Each item's result and its runs, after the batch's run gave ``results``: each
    model failure runs again alone until it succeeds or has run ``max_runs`` times
    (the batch's run counted). A batch with fewer than ``min_failures`` model
    failures is left as it is."""
    results = list(results)
    runs = [1] * len(results)
    if sum(1 for result in results if model_failure(result)) < min_failures:
        return results, runs
    for i in range(len(results)):
        while model_failure(results[i]) and runs[i] < max_runs:
            results[i] = engine.predict_many([params[i]], [contexts[i]])[0]
            runs[i] += 1
    return results, runs
