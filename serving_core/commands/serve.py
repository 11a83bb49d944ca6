"""``serving-core serve``: SERVING_HANDLER behind gunicorn, settings from SERVING_* variables.

With ``--reload`` (development), a reloader (``process.reload``) serves it
through ``serve`` children instead, a new one each time the handler's files
change; each child is started with ``--handoff``, which no user types.
"""

from __future__ import annotations

import logging
import sys

from serving_core import logs
from serving_core.commands import startup
from serving_core.commands.failure import Failure
from serving_core.errors import HandlerError
from serving_core.process.handlerfiles import HandlerFiles, handler_folder
from serving_core.process.handoff import Handoff
from serving_core.process.reload import Reloader, refuse_unsupported
from serving_core.process.server import runtime_for, serve
from serving_core.settings import Settings, SettingsError


def main(settings: Settings, *, reload: bool = False, handoff: str | None = None) -> int:
    if reload:
        return _reload(settings)
    # A gevent worker's pipeline stage calls run on greenlets.
    loaded = startup.load(
        settings,
        shared_metrics=True,
        runtime=runtime_for(settings),
        uses_queue=settings.jobs_enabled or bool(settings.followup_queue),
    )
    try:
        serve(settings, loaded, Handoff.parse(handoff) if handoff else None)
    except (SettingsError, HandlerError) as exc:
        # Refused before fork (a keys file, a pipeline's stages): the message says it all.
        raise Failure(str(exc)) from exc
    except Exception as exc:
        # setup() failing is the usual cause: say so with the handler's name.
        logging.getLogger("serving_core").exception("serve failed")
        raise Failure(f"{loaded.source}: {exc!r}") from exc
    return 0


def _reload(settings: Settings) -> int:
    logs.configure(settings.log_level, settings.log_format)
    try:
        refuse_unsupported(settings)
        files = HandlerFiles([handler_folder(settings.handler)])
    except SettingsError as exc:
        raise Failure(str(exc)) from exc

    def command(handoff: Handoff) -> list[str]:
        # This interpreter, and the handler as it was resolved here (an argument or
        # SERVING_HANDLER); every other setting comes from the same environment.
        return [
            sys.executable,
            "-m",
            "serving_core.commands.cli",
            "serve",
            settings.handler,
            "--handoff",
            handoff.argument(),
        ]

    return Reloader(settings, command, files).run()
