"""``serving-core batch``: the handler over a file or a table, resumably (``batch.command``)."""

from __future__ import annotations

import argparse
import os

from serving_core import logs
from serving_core.batch import command
from serving_core.commands.startup import provide_grpc_stages
from serving_core.settings import Settings
from serving_core.tracing.tracer import log_fields


def main(args: argparse.Namespace, settings: Settings) -> int:
    logs.configure(settings.log_level, settings.log_format, log_fields)
    provide_grpc_stages()
    # The environment only for Kubernetes' JOB_COMPLETION_INDEX (--shards).
    return command.main(args, settings, os.environ)
