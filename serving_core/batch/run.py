"""``serving-core batch``: the handler over a file or a table, in-process, resumable, sharded.

Order of events (like ``serve``, without HTTP):

1. parent: check the flags, import the handler, open the output and read the
   ids it already holds (cutting off a row a kill tore), open the input;
   ``preload`` it as ``serve`` does (``serving_core.preload``: torch capped at
   one thread, ``setup()``, capped again, ``gc.collect()``, ``gc.freeze()``).
2. fork W workers: each takes its share of the cores, runs ``setup_worker()``
   and then ``Engine.predict_many`` on the chunks it is handed.
3. parent: reads the input, drops other shards' records and those already
   written, hands out chunks (two per worker in flight), and is the one
   writer: each chunk's rows are written whole when its results come back.

A kill loses only the chunks in flight; a rerun with the same ``--output``
skips every id written. A worker that dies fails the run at once (the pool
notices its exit), and the workers die with the parent (``PR_SET_PDEATHSIG``).

Imports only what the CLI already has at module level: ``serving-core
healthcheck`` (the pods' exec probe) imports the CLI, which imports this for
its flags; the records, the engine and the handler are imported to run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from concurrent.futures import Future, ProcessPoolExecutor

    from serving_core.batch.records import Record, Shard, Sink, Source
    from serving_core.engine.core import Engine
    from serving_core.handler import Handler, Output, Params
    from serving_core.settings import Settings

log = logging.getLogger("serving_core.batch.run")

EXIT_OK = 0
EXIT_FAILED = 1  # some records were written with their errors, or a worker died
EXIT_CONFIG = 2  # bad flags, an unreadable input or output, a broken handler
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: what was written stays; rerun to resume
DEFAULT_CHUNK_SIZE = 64
PROGRESS_EVERY_S = 10.0
IN_FLIGHT_PER_WORKER = 2  # one chunk runs while the next waits: no worker idles
PR_SET_PDEATHSIG = 1

OnResult = Callable[["Params", "Output"], None]

DESCRIPTION = """\
Run the handler over every record of a file or a database table, with no
HTTP: setup() once, then W forked workers (SERVING_WORKERS, else the usable
cores) in chunks of --chunk-size, each through the same engine as /predict.

Formats, by suffix: .jsonl/.ndjson, .csv, .parquet (a file or a directory),
a SQLAlchemy URL (sqlite:///x.db, postgresql://...) or a bare .db/.sqlite
path. Each output row is the id and either "output" or "error" (JSON text
in CSV, Parquet and SQL columns). Parquet output is a directory of part files.

Resume: a rerun with the same --output skips every id already written,
failed ones included. Records without an id field get their 0-based position
in the input as their id, so give them an id (or an ORDER BY) when the input
may change between runs.

Shards: --shard I/N runs the records whose id hashes to I. In an Indexed Job,
pass --shards N and the index comes from JOB_COMPLETION_INDEX. JSONL and
CSV outputs get one file per shard (NAME.shard-I-of-N.jsonl); Parquet
directories and SQL tables are shared.

Exit status: 0 every record succeeded, 1 some failed (written with their
errors) or a worker died, 2 a configuration error, 130 interrupted.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--input", required=True, metavar="SRC", help="records to predict")
    parser.add_argument("--input-table", metavar="TABLE", help="SQL input: read this table")
    parser.add_argument("--input-query", metavar="SQL", help="SQL input: read this query")
    parser.add_argument("--output", required=True, metavar="DST", help="where results go")
    parser.add_argument(
        "--output-table",
        metavar="TABLE",
        help="SQL output: the table (default results; created if missing)",
    )
    parser.add_argument(
        "--id-field", default="id", help="the records' id column or key (default id)"
    )
    parser.add_argument("--handler", help="handler.py, its folder or a module (SERVING_HANDLER)")
    parser.add_argument("--workers", type=int, help="worker processes (SERVING_WORKERS)")
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=DEFAULT_CHUNK_SIZE,
        help=f"records per work unit and per write (default {DEFAULT_CHUNK_SIZE})",
    )
    parser.add_argument("--shard", metavar="I/N", help="run shard I of N (0-based)")
    parser.add_argument(
        "--shards", type=int, metavar="N", help="N shards, this one from JOB_COMPLETION_INDEX"
    )
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="write each successful result into the inference cache (SERVING_CACHE_*)",
    )


def main(args: argparse.Namespace, settings: Settings, environ: Mapping[str, str]) -> int:
    """``serving-core batch``; ``environ`` only for Kubernetes' JOB_COMPLETION_INDEX."""
    from serving_core.batch.formats import open_sink, open_source
    from serving_core.batch.records import (
        RecordsError,
        input_location,
        output_location,
    )
    from serving_core.errors import HandlerError
    from serving_core.loading import load_handler
    from serving_core.preload import preload

    with contextlib.ExitStack() as closing:
        try:
            if args.chunk_size < 1 or (args.workers is not None and args.workers < 1):
                raise RecordsError("--chunk-size and --workers must be at least 1")
            shard = resolve_shard(args.shard, args.shards, environ)
            source_at = input_location(args.input, args.input_table, args.input_query)
            sink_at = output_location(args.output, args.output_table)
            loaded = load_handler(
                args.handler or settings.handler,
                device=settings.device,
                dtype=settings.dtype,
                environ=environ,
            )
            on_result = cache_writer(settings, loaded.handler) if args.warm_cache else None
            # The output first: SQLite output switches the file to WAL before a
            # read of the same file begins.
            sink = open_sink(sink_at, args.id_field, shard)
            closing.callback(sink.close)
            done = sink.written()
            source = open_source(source_at, args.id_field)
            closing.callback(source.close)
        except (RecordsError, HandlerError) as exc:
            print(f"serving-core: error: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        try:
            preload(loaded.handler)  # as serve and worker do
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


def resolve_shard(text: str | None, count: int | None, environ: Mapping[str, str]) -> Shard:
    """--shard I/N, else index JOB_COMPLETION_INDEX of --shards N, else the whole input."""
    from serving_core.batch.records import RecordsError, Shard

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
    request (handler name, version, canonical params). It runs in the workers."""
    from serving_core.batch.records import RecordsError
    from serving_core.cache.core import from_settings
    from serving_core.handler import handler_name

    if not settings.cache_url:
        raise RecordsError(
            "--warm-cache fills the online service's shared cache: set SERVING_CACHE_URL "
            "to the same redis://… URL it uses (a cache in this run's memory ends with it)"
        )
    cache = from_settings(settings, handler)
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


@dataclass
class Counts:
    written: int = 0
    failed: int = 0
    skipped: int = 0  # already in the output
    skipped_failed: int = 0  # of those, written with an error by an earlier run
    duplicates: int = 0  # an id seen earlier in this input: not run again

    @property
    def seen(self) -> int:
        return self.written + self.skipped + self.duplicates


@dataclass
class BatchRun:
    handler: Handler
    workers: int
    max_batch_size: int
    chunk_size: int
    shard: Shard
    on_result: OnResult | None = None
    tally: Counts = field(default_factory=Counts)

    def run(self, source: Source, sink: Sink, done: Mapping[str, bool]) -> int:
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool
        from multiprocessing import get_context

        count = source.count()
        total = None if count is None else math.ceil(count / self.shard.count)
        progress = Progress(total, sys.stderr.isatty())
        # Fork, not spawn: the workers share the model setup() loaded.
        pool = ProcessPoolExecutor(
            self.workers,
            mp_context=get_context("fork"),
            initializer=_start_worker,
            initargs=(self.handler, self.max_batch_size, self.workers, self.on_result, os.getpid()),
        )
        previous_term = signal.signal(signal.SIGTERM, _interrupt)
        started = time.monotonic()
        try:
            self._feed(pool, self._chunks(source, done), sink, progress)
        except BrokenProcessPool as exc:
            log.error(
                "a worker process died (%s); the chunks in flight were not written: "
                "rerun with the same --output to resume",
                exc,
            )
            return EXIT_CONFIG if "initializer" in str(exc) else EXIT_FAILED
        except KeyboardInterrupt:
            log.error(
                "interrupted after %d records; rerun with the same --output to resume",
                self.tally.written,
            )
            return EXIT_INTERRUPTED
        finally:
            signal.signal(signal.SIGTERM, previous_term)
            _stop(pool)
            progress.close()
        elapsed = time.monotonic() - started
        self._summary(sink, elapsed)
        return EXIT_FAILED if self.tally.failed or self.tally.skipped_failed else EXIT_OK

    def _chunks(self, source: Source, done: Mapping[str, bool]) -> Iterator[list[Record]]:
        chunk: list[Record] = []
        handed: set[str] = set()
        for record in source:
            if not self.shard.owns(record.key):
                continue
            if record.key in done:
                self.tally.skipped += 1
                self.tally.skipped_failed += not done[record.key]
                continue
            if record.key in handed:
                # A second row for one id could never be told apart on resume
                # (and a SQL primary key refuses it): the first one stands.
                if not self.tally.duplicates:
                    log.warning("id %r repeats an earlier record's; skipping it", record.key)
                self.tally.duplicates += 1
                continue
            handed.add(record.key)
            chunk.append(record)
            if len(chunk) == self.chunk_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    def _feed(
        self,
        pool: ProcessPoolExecutor,
        chunks: Iterator[list[Record]],
        sink: Sink,
        progress: Progress,
    ) -> None:
        from concurrent.futures import FIRST_COMPLETED, wait

        pending: dict[Future[list[tuple[bool, bytes]]], list[Record]] = {}
        for chunk in chunks:
            good = [r for r in chunk if r.error is None]
            if not good:
                self._write(sink, chunk, [], progress)
                continue
            future = pool.submit(_predict, [r.params for r in good], [r.key for r in good])
            pending[future] = chunk
            while len(pending) >= IN_FLIGHT_PER_WORKER * self.workers:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    self._write(sink, pending.pop(future), future.result(), progress)
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                self._write(sink, pending.pop(future), future.result(), progress)

    def _write(
        self,
        sink: Sink,
        chunk: Sequence[Record],
        results: Sequence[tuple[bool, bytes]],
        progress: Progress,
    ) -> None:
        from serving_core import encoding
        from serving_core.batch.records import Row

        answers = iter(results)
        rows = []
        for record in chunk:
            if record.error is not None:
                ok, data = False, encoding.dumps(record.error)
            else:
                ok, data = next(answers)
            rows.append(Row(record.id, record.key, data if ok else None, None if ok else data))
            self.tally.failed += not ok
        sink.write(rows)
        self.tally.written += len(rows)
        progress.update(self.tally)

    def _summary(self, sink: Sink, elapsed_s: float) -> None:
        tally = self.tally
        rate = tally.written / elapsed_s if elapsed_s > 0 else 0.0
        log.info(
            "batch: %d records written to %s (%d ok, %d failed) in %.2f s, %.1f records/s; "
            "%d skipped as already written (%d of them failed), %d duplicate ids skipped",
            tally.written,
            sink.where,
            tally.written - tally.failed,
            tally.failed,
            elapsed_s,
            rate,
            tally.skipped,
            tally.skipped_failed,
            tally.duplicates,
        )


class Progress:
    """A tqdm bar (rate, ETA) on a terminal; a plain log line every 10 s otherwise."""

    def __init__(self, total: int | None, tty: bool) -> None:
        self._total = total
        self._started = time.monotonic()
        self._logged = self._started
        self._shown = 0
        self._bar: Any = None
        if tty:
            from tqdm import tqdm

            # No monitor thread: the workers fork while the bar exists.
            tqdm.monitor_interval = 0
            self._bar = tqdm(total=total, unit="rec", dynamic_ncols=True, file=sys.stderr)

    def update(self, tally: Counts) -> None:
        if self._bar is not None:
            self._bar.set_postfix(failed=tally.failed, refresh=False)
            self._bar.update(tally.seen - self._shown)
            self._shown = tally.seen
            return
        now = time.monotonic()
        if now - self._logged < PROGRESS_EVERY_S:
            return
        self._logged = now
        rate = tally.written / (now - self._started)
        if self._total:
            left = max(0, self._total - tally.seen)
            eta = f", ETA {left / rate:.0f} s" if rate > 0 else ""
            where = f"{tally.seen}/{self._total} ({100 * tally.seen / self._total:.0f}%)"
        else:
            eta, where = "", str(tally.seen)
        log.info("batch: %s records, %.1f/s, %d failed%s", where, rate, tally.failed, eta)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _interrupt(signum: int, frame: Any) -> None:
    # SIGTERM (a pod being deleted) ends the run like Ctrl-C: written chunks stay.
    raise KeyboardInterrupt


def _stop(pool: ProcessPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
    # Workers ignore SIGINT and finish their chunk otherwise; its results would be dropped.
    for process in list((pool._processes or {}).values()):
        process.kill()
    pool.shutdown(wait=True)


# -- in each worker process ---------------------------------------------------


@dataclass
class _Worker:
    engine: Engine | None = None
    on_result: OnResult | None = None


# ProcessPoolExecutor runs module-level functions in the workers; this is the
# one piece of per-process state they share, filled once by the initializer.
_worker = _Worker()


def _start_worker(
    handler: Handler,
    max_batch_size: int,
    workers: int,
    on_result: OnResult | None,
    parent: int,
) -> None:
    # Ctrl-C reaches the whole process group: the parent alone decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with(parent)
    from serving_core.engine.core import Engine
    from serving_core.threads import set_worker_threads

    set_worker_threads(workers)
    handler.setup_worker()
    _worker.engine = Engine(handler, max_batch_size=max_batch_size)
    _worker.on_result = on_result


def _die_with(parent: int) -> None:
    """SIGKILL this worker when the parent dies (a killed parent cannot stop it)."""
    if sys.platform != "linux":
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _predict(params: list[Params], keys: list[str]) -> list[tuple[bool, bytes]]:
    """One chunk: (True, output JSON) or (False, error JSON) per record, in order.
    Encoded here, so that the parent, the one writer, only copies bytes."""
    from serving_core import encoding
    from serving_core.context import Context
    from serving_core.errors import ServingError

    engine, on_result = _worker.engine, _worker.on_result
    assert engine is not None, "the worker initializer did not run"
    results = engine.predict_many(params, [Context(key) for key in keys])
    answers: list[tuple[bool, bytes]] = []
    for one, result in zip(params, results, strict=True):
        if isinstance(result, ServingError):
            answers.append((False, encoding.dumps(result.body()["error"])))
            continue
        try:
            answers.append((True, encoding.dumps(result)))
        except TypeError as exc:
            message = f"the handler's output cannot be written as JSON: {exc}"
            answers.append((False, encoding.dumps({"type": "model_error", "message": message})))
            continue
        if on_result is not None:
            try:
                on_result(one, result)
            except Exception:
                # A result not cached is a later miss, never a failed record.
                log.warning("--warm-cache: writing a result failed", exc_info=True)
    return answers
