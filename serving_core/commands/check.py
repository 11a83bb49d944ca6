"""``serving-core check``: load a handler, run its sample request, print the output.

The same engine as ``/predict`` and ``batch`` (validate, preprocess, the model,
postprocess), with no server: what ``make check`` and ``make test`` run.
"""

from __future__ import annotations

import dataclasses
import json

from serving_core import encoding
from serving_core.commands import startup
from serving_core.commands.failure import EXIT_PREDICT, Failure
from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.errors import ServingError
from serving_core.loading import LoadedHandler
from serving_core.pipeline.pipeline import Pipeline
from serving_core.settings import Settings, SettingsError


def main(settings: Settings, handler: str, raw_params: str | None) -> int:
    """Check ``handler`` (a path or module) with ``raw_params``, else its sample.json."""
    try:
        settings = dataclasses.replace(settings, handler=handler)
    except SettingsError as exc:
        raise Failure(str(exc)) from exc
    loaded = startup.load(settings, shared_metrics=False)
    if raw_params is not None:
        try:
            params = json.loads(raw_params)
        except ValueError as exc:
            raise Failure(f"--params is not JSON: {exc}") from exc
    elif loaded.sample is not None and not _unset_stage_urls(loaded):
        params = loaded.sample
    else:
        print(_nothing_run(loaded))
        return 0
    if not isinstance(params, dict):
        raise Failure("the request parameters must be a JSON object")
    engine = Engine(
        loaded.handler, max_batch_size=settings.max_batch_size, max_tokens=settings.max_tokens
    )
    try:
        loaded.handler.setup()
        loaded.handler.setup_worker()
        (result,) = engine.predict_many([params], [Context("check")])
    except Exception as exc:
        raise Failure(f"{loaded.source}: {exc!r}") from exc
    if isinstance(result, ServingError):
        raise Failure(f"{loaded.source}: {result.message}", EXIT_PREDICT)
    print(encoding.dumps(result).decode())
    return 0


def _nothing_run(loaded: LoadedHandler) -> str:
    unset = _unset_stage_urls(loaded)
    if loaded.sample is not None and unset:
        # A pipeline's sample needs its stages up; make check runs without them.
        return (
            f"serving-core: {loaded.source} loaded (a pipeline); its sample was not run: "
            f"the stage variable(s) {', '.join(unset)} are not set"
        )
    return (
        f"serving-core: {loaded.source} loaded; no sample.json beside it and no --params, "
        "so nothing was run"
    )


def _unset_stage_urls(loaded: LoadedHandler) -> list[str]:
    return loaded.handler.spec.unset() if isinstance(loaded.handler, Pipeline) else []
