"""The command line: ``serve``, ``worker``, ``check``, ``batch``, ``init`` and ``healthcheck``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from serving_core.batch import command as batch
from serving_core.commands import healthcheck as probe
from serving_core.commands import init as scaffold
from serving_core.settings import Settings, SettingsError

if TYPE_CHECKING:
    from serving_core.loading import LoadedHandler

EXIT_CONFIG = 2  # a bad setting or a broken handler: nothing was served
EXIT_PREDICT = 1  # the handler loaded but its sample failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="serving-core", description="Serve a handler.py with batching and gunicorn."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "serve", help="serve SERVING_HANDLER with gunicorn (settings from SERVING_* variables)"
    )
    commands.add_parser(
        "worker",
        help="run SERVING_HANDLER over its job queue (POST /jobs), in batches; "
        "/healthz and /metrics on SERVING_BIND",
    )
    check = commands.add_parser(
        "check", help="load a handler, run its sample request, print the output"
    )
    check.add_argument("handler", help="handler.py path, its folder, or module[:Class]")
    check.add_argument("--params", help="JSON object to send instead of the sample.json")
    init = commands.add_parser(
        "init", help="create handlers/NAME/ with a handler.py skeleton, sample.json, requirements"
    )
    init.add_argument("name", help="the handler's name, e.g. sentiment")
    init.add_argument(
        "--dir", default="handlers", help="the folder to create it in (default handlers)"
    )
    batch.add_arguments(
        commands.add_parser("batch", help="run the handler over a file or a table, resumably")
    )
    health = commands.add_parser(
        "healthcheck", help="exit 0 if the server at SERVING_BIND answers 200 (for HEALTHCHECK)"
    )
    health.add_argument("--path", default="/healthz", help="the route to ask (default /healthz)")
    health.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.command == "init":
        return _init(args.name, args.dir)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"serving-core: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "healthcheck":
        healthy, seen = probe.check(settings.bind, args.path, args.timeout_s)
        print(f"serving-core: {seen}", file=sys.stdout if healthy else sys.stderr)
        return 0 if healthy else 1
    if args.command == "batch":
        _configure_logging(settings)
        return batch.main(args, settings, os.environ)
    return _load_and_run(args, settings)


def _load_and_run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here, not at the top: the healthcheck above is the pods' exec
    # probe, started every few seconds, and needs none of this (nor Flask).
    from serving_core.errors import HandlerError
    from serving_core.loading import load_handler
    from serving_core.metrics import enable_multiprocess

    try:
        if args.command == "check":
            settings = dataclasses.replace(settings, handler=args.handler)
        _configure_logging(settings)
        if args.command in ("serve", "worker"):
            # Before the handler is imported: it might import prometheus_client.
            enable_multiprocess(settings.metrics_dir)
        loaded = load_handler(
            settings.handler, device=settings.device, dtype=settings.dtype, environ=os.environ
        )
    except (SettingsError, HandlerError) as exc:
        print(f"serving-core: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command == "serve":
        from serving_core.process.server import serve

        try:
            serve(settings, loaded)
        except Exception as exc:
            # setup() failing is the usual cause: say so with the handler's name.
            logging.getLogger("serving_core").exception("serve failed")
            print(f"serving-core: error: {loaded.source}: {exc!r}", file=sys.stderr)
            return EXIT_CONFIG
        return 0
    if args.command == "worker":
        from serving_core.process.jobworker import Master

        try:
            return Master(settings, loaded).run()
        except Exception as exc:
            logging.getLogger("serving_core").exception("worker failed")
            print(f"serving-core: error: {loaded.source}: {exc!r}", file=sys.stderr)
            return EXIT_CONFIG
    return _check(settings, loaded, args.params)


def _check(settings: Settings, loaded: LoadedHandler, raw_params: str | None) -> int:
    from serving_core import encoding
    from serving_core.context import Context
    from serving_core.engine.core import Engine
    from serving_core.errors import ServingError

    if raw_params is not None:
        try:
            params = json.loads(raw_params)
        except ValueError as exc:
            print(f"serving-core: error: --params is not JSON: {exc}", file=sys.stderr)
            return EXIT_CONFIG
    elif loaded.sample is not None and not _unset_stage_urls(loaded):
        params = loaded.sample
    else:
        print(_nothing_run(loaded))
        return 0
    if not isinstance(params, dict):
        print("serving-core: error: the request parameters must be a JSON object", file=sys.stderr)
        return EXIT_CONFIG
    # The same engine as /predict and batch: validate, preprocess, the model, postprocess.
    engine = Engine(loaded.handler, max_batch_size=settings.max_batch_size)
    try:
        loaded.handler.setup()
        loaded.handler.setup_worker()
        (result,) = engine.predict_many([params], [Context("check")])
    except Exception as exc:
        print(f"serving-core: error: {loaded.source}: {exc!r}", file=sys.stderr)
        return EXIT_CONFIG
    if isinstance(result, ServingError):
        print(f"serving-core: error: {loaded.source}: {result.message}", file=sys.stderr)
        return EXIT_PREDICT
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
    from serving_core.pipeline.core import Pipeline

    return loaded.handler.spec.unset() if isinstance(loaded.handler, Pipeline) else []


def _init(name: str, parent: str) -> int:
    try:
        folder = scaffold.create(name, Path(parent))
    except (scaffold.ScaffoldError, OSError) as exc:
        print(f"serving-core: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    steps = [
        (f"serving-core check {folder}", "run its sample.json (make test does too)"),
        (f"SERVING_HANDLER={folder} make serve", "serve it on 127.0.0.1:8000"),
        (f"make image HANDLER_DIR={folder}", "build its image"),
    ]
    width = max(len(command) for command, _ in steps)
    print(f"created {folder}/: handler.py, sample.json, requirements.txt")
    for command, why in steps:
        print(f"  {command:<{width}}  # {why}")
    return 0


def _configure_logging(settings: Settings) -> None:
    from serving_core import logs

    logs.configure(settings.log_level, settings.log_format)


if __name__ == "__main__":
    raise SystemExit(main())
