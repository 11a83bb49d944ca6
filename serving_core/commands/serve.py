"""``serving-core serve``: SERVING_HANDLER behind gunicorn, settings from SERVING_* variables."""

from __future__ import annotations

import logging

from serving_core.commands import startup
from serving_core.commands.failure import Failure
from serving_core.errors import HandlerError
from serving_core.process.server import runtime_for, serve
from serving_core.settings import Settings, SettingsError


def main(settings: Settings) -> int:
    # A gevent worker's pipeline stage calls run on greenlets.
    loaded = startup.load(
        settings,
        shared_metrics=True,
        runtime=runtime_for(settings),
        uses_queue=settings.jobs_enabled or bool(settings.followup_queue),
    )
    try:
        serve(settings, loaded)
    except (SettingsError, HandlerError) as exc:
        # Refused before fork (a keys file, a pipeline's stages): the message says it all.
        raise Failure(str(exc)) from exc
    except Exception as exc:
        # setup() failing is the usual cause: say so with the handler's name.
        logging.getLogger("serving_core").exception("serve failed")
        raise Failure(f"{loaded.source}: {exc!r}") from exc
    return 0
