"""gunicorn's settings for ``serving-core serve``, from ``Settings`` and the server's hooks."""

from __future__ import annotations

import math
from typing import Any

from serving_core.process.accesslog import logger_class
from serving_core.process.hooks import Hooks
from serving_core.settings import Settings

WORKER_CLASSES = {
    "gevent": "serving_core.process.workers.green.GreenWorker",
    "gthread": "serving_core.process.workers.gthread.StampingThreadWorker",
}


def gunicorn_options(
    settings: Settings, hooks: Hooks, name: str, revision: str = ""
) -> dict[str, Any]:
    """What ``ServingApplication`` sets in gunicorn's config; ``name`` is the handler's,
    ``revision`` its model's (``handler.model_revision``), in each access line."""
    return {
        "bind": [settings.bind],
        "workers": settings.workers,
        "worker_class": WORKER_CLASSES[settings.worker_class],
        "threads": settings.threads,
        "worker_connections": settings.worker_connections,
        "preload_app": True,
        "max_requests": settings.max_requests,
        "max_requests_jitter": settings.max_requests_jitter,
        # gunicorn takes whole seconds here.
        "keepalive": math.ceil(settings.keepalive_s),
        "graceful_timeout": math.ceil(settings.graceful_timeout_s),
        # The heartbeat timeout only kills a worker whose main loop is stuck;
        # gthread's loop runs while requests wait, so the request deadline
        # needs no room here beyond boot (the warm-up runs in post_fork).
        "timeout": max(30, math.ceil(2 * settings.request_timeout_s)),
        "loglevel": settings.log_level,
        "accesslog": "-",
        "errorlog": "-",
        # gunicorn's access line, written without its per-request atoms dict.
        "logger_class": logger_class(settings.log_format, revision),
        "when_ready": hooks.when_ready,
        "post_fork": hooks.post_fork,
        "post_worker_init": hooks.post_worker_init,
        "worker_exit": hooks.worker_exit,
        "child_exit": hooks.child_exit,
        "on_exit": hooks.on_exit,
        "proc_name": f"serving-core[{name}]",
        # gunicorn 24+ opens a control socket under $HOME by default; we do not
        # use it, and the chart's root filesystem is read-only.
        "control_socket_disable": True,
    }
