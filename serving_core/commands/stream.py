"""``serving-core stream``: SERVING_HANDLER over a broker's messages, in batches."""

from __future__ import annotations

import logging

from serving_core.commands import startup
from serving_core.commands.failure import Failure
from serving_core.process.health import BindError
from serving_core.process.streammaster import StreamMaster, check
from serving_core.settings import Settings


def main(settings: Settings) -> int:
    try:
        check(settings)  # before a model loads for minutes
    except ValueError as exc:
        raise Failure(str(exc)) from exc
    loaded = startup.load(settings, shared_metrics=True)
    try:
        return StreamMaster(settings, loaded).run()
    except BindError as exc:  # a setting, not the handler: no traceback
        raise Failure(str(exc)) from exc
    except Exception as exc:
        logging.getLogger("serving_core").exception("stream failed")
        raise Failure(f"{loaded.source}: {exc!r}") from exc
