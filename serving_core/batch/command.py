"""``serving-core batch``: the handler over a file or a table, in-process, resumable, sharded.

Order of events (like ``serve``, without HTTP):

1. parent: check the flags, import the handler, open the output and read the
   ids it already holds (cutting off a row a kill tore; with ``--retry-failed``,
   removing this shard's error rows, whose ids are then not written), open the input;
   ``preload`` it as ``serve`` does (``serving_core.preload``: torch capped at
   one thread, ``setup()``, capped again, ``gc.collect()``, ``gc.freeze()``).
2. fork W workers (``pool``): each takes its share of the cores, runs
   ``setup_worker()`` and then ``Engine.predict_many`` on the chunks it is handed.
3. parent (``run``): reads the input, drops other shards' records and those
   already written, hands out chunks (two per worker in flight), and is the one
   writer: each chunk's rows are written whole when its results come back.

A kill loses only the chunks in flight; a rerun with the same ``--output``
skips every id written. A worker that dies fails the run at once (the pool
notices its exit), and the workers die with the parent (``PR_SET_PDEATHSIG``).

The flags are ``batch.flags``: the CLI imports those for every verb,
``serving-core healthcheck`` (the pods' exec probe) included, and this module
only when ``batch`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import sys
from collections.abc import Mapping

from serving_core.batch.formats import input_location, open_sink, open_source, output_location
from serving_core.batch.pool import OnResult
from serving_core.batch.records import RecordsError, RecordSink, Shard, refuse_overlap
from serving_core.batch.run import EXIT_CONFIG, BatchRun
from serving_core.cache.cache import from_settings
from serving_core.errors import HandlerError
from serving_core.handler import Handler, Output, Params, handler_name
from serving_core.loading import give_artifacts, load_handler
from serving_core.preload import preload
from serving_core.settings import Settings
from serving_core.threads import share_idle_cores
from serving_core.tracing import setup as tracing

log = logging.getLogger("serving_core.batch.command")


def main(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    """``serving-core batch``; ``environ`` only for Kubernetes' JOB_COMPLETION_INDEX and
    OpenTelemetry's TRACEPARENT."""
    with contextlib.ExitStack() as closing:
        try:
            if args.chunk_size < 1 or (args.workers is not None and args.workers < 1):
                raise RecordsError("--chunk-size and --workers must be at least 1")
            shard = resolve_shard(args.shard, args.shards, environ)
            source_at = input_location(args.input, args.input_table, args.input_query)
            sink_at = output_location(args.output, args.output_table)
            refuse_overlap(source_at, sink_at, shard)  # before the output is opened
            loaded = load_handler(
                args.handler or settings.handler,
                device=settings.device,
                dtype=settings.dtype,
                environ=environ,
            )
            give_artifacts(
                loaded.handler,
                settings.model_uri,
                settings.model_cache,
                offline=settings.model_offline,
            )
            on_result = cache_writer(settings, loaded.handler) if args.warm_cache else None
            # The output first: SQLite output switches the file to WAL before a
            # read of the same file begins.
            sink = open_sink(sink_at, args.id_field, shard)
            closing.callback(sink.close)
            done = sink.written()
            if args.retry_failed:
                done = retry_failed(sink, done, shard)
            source = open_source(source_at, args.id_field)
            closing.callback(source.close)
        except (RecordsError, HandlerError) as exc:
            print(f"serving-core: error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        try:
            preload(loaded.handler)  # as serve and worker do
            share_idle_cores(settings, args.workers or settings.workers)
        except Exception as exc:
            log.exception("setup() failed")
            print(f"serving-core: error: {loaded.source}: setup() failed: {exc!r}", file=sys.stderr)
            return EXIT_CONFIG
        job = BatchRun(
            handler=loaded.handler,
            workers=args.workers or settings.workers,
            max_batch_size=settings.max_batch_size,
            chunk_size=args.chunk_size,
            shard=shard,
            on_result=on_result,
            start_tracing=(
                None
                if settings.traces == "off"
                else functools.partial(tracing.start_for, settings, loaded.handler)
            ),
            # OpenTelemetry's carrier for a process: a workflow (Airflow, a CI job)
            # that starts the run passes its span down, and the run is drawn in it.
            traceparent=environ.get("TRACEPARENT"),
        )
        log.info(
            "batch: %s -> %s, shard %d/%d, %d workers, chunks of %d; %d ids already written",
            source_at.describe(),
            sink.where,
            shard.index,
            shard.count,
            job.workers,
            job.chunk_size,
            len(done),
        )
        return job.run(source, sink, done)
    raise AssertionError("unreachable")  # ExitStack may swallow exceptions, as far as mypy knows


def retry_failed(sink: RecordSink, done: dict[str, bool], shard: Shard) -> dict[str, bool]:
    """``--retry-failed``: drop this shard's error rows from the output, and return the
    ids still written. Dropped before the run rather than replaced as it writes: an
    id not written is what every format already resumes, so a kill part-way leaves
    an output a plain rerun completes, with each id once."""
    failed = {key for key, ok in done.items() if not ok and shard.owns(key)}
    if failed:
        log.info("--retry-failed: %d failed ids are predicted again", len(failed))
        sink.drop_failed(failed)
    return {key: ok for key, ok in done.items() if key not in failed}


def resolve_shard(text: str | None, count: int | None, environ: Mapping[str, str]) -> Shard:
    """--shard I/N, else index JOB_COMPLETION_INDEX of --shards N, else the whole input."""
    index = environ.get("JOB_COMPLETION_INDEX", "").strip()
    if text is not None:
        shard = Shard.parse(text)
        if count is not None and count != shard.count:
            raise RecordsError(f"--shard {text} and --shards {count} disagree; give one")
        return shard
    if count is None:
        if index not in ("", "0"):
            log.warning(
                "JOB_COMPLETION_INDEX=%s but no --shards: this pod runs the whole input", index
            )
        return Shard()
    if not index.isdigit():
        raise RecordsError(
            f"--shards {count} needs this shard's index: --shard I/{count}, or "
            "JOB_COMPLETION_INDEX (which an Indexed Job sets)"
        )
    return Shard.of(int(index), count)


def cache_writer(settings: Settings, handler: Handler) -> OnResult:
    """``--warm-cache``: a callback that puts each successful (params, output) into the
    shared inference cache, under the key the online service computes for the same
    request from a caller without a key (handler name, version, SERVING_MODEL_REVISION,
    canonical params). It runs in the workers."""
    if not settings.cache_url:
        raise RecordsError(
            "--warm-cache fills the online service's shared cache: set SERVING_CACHE_URL "
            "to the same redis://… URL it uses (a cache in this run's memory ends with it)"
        )
    if (settings.api_keys or settings.api_keys_file) and settings.cache_per_key:
        raise RecordsError(
            "--warm-cache writes entries for callers without a key, and with API keys on "
            "each key has its own: set SERVING_CACHE_PER_KEY=false here and on the "
            "service to share entries between keys, or drop --warm-cache"
        )
    try:
        cache = from_settings(settings, handler)
    except ValueError as exc:  # SERVING_CACHE_URL, refused by its store's own check
        raise RecordsError(str(exc)) from exc
    if cache is None:
        raise RecordsError(
            f"--warm-cache: {handler_name(handler)} sets cacheable = False, or "
            "SERVING_CACHE_SIZE=0 turned the cache off"
        )

    def write(params: Params, output: Output) -> None:
        key = cache.key_for(params)
        if key is not None:
            cache.fill(key, output)

    return write
