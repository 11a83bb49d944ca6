"""``serving-core``: the parser, and the verb each command runs (a module of its own each)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

from serving_core.batch.flags import add_arguments as add_batch_arguments
from serving_core.commands.failure import Failure
from serving_core.settings import Settings, SettingsError


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _run(args)
    except Failure as exc:
        print(f"serving-core: error: {exc}", file=sys.stderr)
        return exc.status


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="serving-core", description="Serve a handler.py with batching and gunicorn."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    verbs = {}
    for verb, help_ in (
        ("serve", "serve the handler with gunicorn (settings from SERVING_* variables)"),
        (
            "worker",
            "run the handler over its job queue (POST /jobs), in batches; "
            "/healthz and /metrics on SERVING_BIND",
        ),
        (
            "stream",
            "run the handler over SERVING_STREAM_SOURCE's messages, in batches, results to "
            "SERVING_STREAM_SINK; /healthz and /metrics on SERVING_BIND",
        ),
    ):
        verbs[verb] = commands.add_parser(verb, help=help_)
        verbs[verb].add_argument(
            "handler",
            nargs="?",
            help="handler.py path, its folder, or module[:Class] (default: SERVING_HANDLER)",
        )
    verbs["serve"].add_argument(
        "--reload",
        action="store_true",
        help="for development: serve a new version whenever the handler's files change, "
        "once it has started and passed its warm-up; a broken one leaves the old serving",
    )
    # How --reload hands each server it starts the socket and its pipe (process.reload).
    verbs["serve"].add_argument("--handoff", help=argparse.SUPPRESS)
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
    add_batch_arguments(
        commands.add_parser("batch", help="run the handler over a file or a table, resumably")
    )
    commands.add_parser(
        "fetch",
        help="fetch SERVING_MODEL_URI into SERVING_MODEL_CACHE, verified (the init container's)",
    )
    health = commands.add_parser(
        "healthcheck", help="exit 0 if the server at SERVING_BIND answers 200 (for HEALTHCHECK)"
    )
    health.add_argument("--path", default="/healthz", help="the route to ask (default /healthz)")
    health.add_argument("--timeout-s", type=float, default=3.0)
    return parser


def _run(args: argparse.Namespace) -> int:
    # Each verb is imported when it runs: healthcheck is the pods' exec probe,
    # started every few seconds, and loads none of the others' stacks (Flask,
    # gunicorn, the engine, the handler). tests/test_package.py holds it to that.
    if args.command == "init":
        from serving_core.commands import init

        return init.main(args.name, Path(args.dir))
    try:
        settings = Settings.from_env(os.environ)
        if getattr(args, "handler", None) and args.command != "check":
            # As SERVING_HANDLER would: the same parser checks it.
            settings = dataclasses.replace(settings, handler=args.handler)
    except SettingsError as exc:
        raise Failure(str(exc)) from exc
    if args.command in ("healthcheck", "fetch"):
        return _without_handler(args, settings)
    if args.command == "batch":
        from serving_core.commands import batch

        return batch.main(args, settings)
    if args.command == "check":
        from serving_core.commands import check

        return check.main(settings, args.handler, args.params)
    if args.command in ("worker", "stream"):
        return _consume(args.command, settings)
    from serving_core.commands import serve

    return serve.main(settings, reload=args.reload, handoff=args.handoff)


def _version(distribution: str = "serving-core") -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return _checkout_version() or "unknown"


def _checkout_version() -> str | None:
    """The version in the pyproject.toml beside this package: run from a checkout that
    was never installed (``PYTHONPATH=. python -m serving_core.commands.cli``)."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    version = project.get("version")
    if project.get("name") != "serving-core" or not isinstance(version, str):
        return None  # another project's file, or a version made at build time
    return f"{version} (a source checkout, not installed)"


def _without_handler(args: argparse.Namespace, settings: Settings) -> int:
    """The verbs that load no handler: the container's probe, and the model's fetch."""
    if args.command == "fetch":
        from serving_core.commands import fetch

        return fetch.main(settings)
    from serving_core.commands import healthcheck

    return healthcheck.main(settings.bind, args.path, args.timeout_s)


def _consume(command: str, settings: Settings) -> int:
    """The prefork consumers: ``worker`` (the job queue) and ``stream`` (a broker)."""
    if command == "stream":
        from serving_core.commands import stream

        return stream.main(settings)
    from serving_core.commands import worker

    return worker.main(settings)


if __name__ == "__main__":
    raise SystemExit(main())
