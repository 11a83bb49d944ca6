"""``serving-core worker``: SERVING_HANDLER over its job queue, in batches."""

from __future__ import annotations

import logging

from serving_core.commands import startup
from serving_core.commands.failure import Failure
from serving_core.process.health import BindError
from serving_core.process.jobmaster import JobMaster
from serving_core.settings import Settings


def main(settings: Settings) -> int:
    loaded = startup.load(settings, shared_metrics=True, uses_queue=True)
    try:
        return JobMaster(settings, loaded).run()
    except BindError as exc:  # a setting, not the handler: no traceback
        raise Failure(str(exc)) from exc
    except Exception as exc:
        logging.getLogger("serving_core").exception("worker failed")
        raise Failure(f"{loaded.source}: {exc!r}") from exc
