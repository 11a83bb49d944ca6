"""One batch run: the parent reads the records, hands chunks to the pool, and writes the rows.

The parent is the one writer: a chunk's rows are written whole when its
results come back, so a kill loses only the chunks in flight, and a rerun
with the same output skips every id written.

Traced, the run is one ``batch`` span (a child of the ``TRACEPARENT`` the run
was started with, if any) and each chunk a ``chunk`` span under it, from its
hand-out to its rows written; the workers' model spans are the chunks' children.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from serving_core import encoding
from serving_core.batch.pool import Answers, OnResult, Pool, StartTracing
from serving_core.batch.progress import Counts, Progress
from serving_core.batch.records import Record, RecordSink, RecordSource, Row, Shard
from serving_core.handler import Handler
from serving_core.tracing import setup as tracing
from serving_core.tracing.tracer import NO_SPAN, Span, tracer

log = logging.getLogger("serving_core.batch.run")

EXIT_OK = 0
EXIT_FAILED = 1  # some records were written with their errors, or a worker died
EXIT_CONFIG = 2  # bad flags, an unreadable input or output, a broken handler
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: what was written stays; rerun to resume
IN_FLIGHT_PER_WORKER = 2  # one chunk runs while the next waits: no worker idles


@dataclass
class BatchRun:
    handler: Handler
    workers: int
    max_batch_size: int
    chunk_size: int
    shard: Shard
    on_result: OnResult | None = None
    tally: Counts = field(default_factory=Counts)
    # SERVING_TRACES on: starts a process's tracer (the parent's, each worker's).
    start_tracing: StartTracing | None = None
    traceparent: str | None = None  # the run's parent span (``TRACEPARENT``), if given

    def run(self, source: RecordSource, sink: RecordSink, done: Mapping[str, bool]) -> int:
        pool = Pool(
            self.handler, self.workers, self.max_batch_size, self.on_result, self.start_tracing
        )
        if self.start_tracing is None:
            return self._run(pool, source, sink, done, NO_SPAN)
        self.start_tracing()  # after the pool's forks: its exporter's thread is ours alone
        try:
            with tracer().span(
                "batch",
                parent=self.traceparent,
                attributes={
                    "serving.shard": f"{self.shard.index}/{self.shard.count}",
                    "serving.workers": self.workers,
                    "serving.chunk_size": self.chunk_size,
                },
            ) as span:
                code = self._run(pool, source, sink, done, span)
                span.set("serving.records_written", self.tally.written)
                span.set("serving.records_failed", self.tally.failed)
                span.set("process.exit.code", code)
                return code
        finally:
            tracing.stop()

    def _run(
        self,
        pool: Pool,
        source: RecordSource,
        sink: RecordSink,
        done: Mapping[str, bool],
        span: Span,
    ) -> int:
        count = source.count()
        total = None if count is None else math.ceil(count / self.shard.count)
        progress = Progress(total, sys.stderr.isatty())
        previous_term = signal.signal(signal.SIGTERM, _interrupt)
        started = time.monotonic()
        finished = False
        try:
            self._feed(pool, self._chunks(source, done), sink, progress, span)
            finished = True
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
            if finished and self.start_tracing is not None:
                pool.close()  # the idle workers exit on their own, their last spans sent
            else:
                pool.stop()
            progress.close()
        elapsed = time.monotonic() - started
        self._summary(sink, elapsed)
        return EXIT_FAILED if self.tally.failed or self.tally.skipped_failed else EXIT_OK

    def _chunks(self, source: RecordSource, done: Mapping[str, bool]) -> Iterator[list[Record]]:
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
        pool: Pool,
        chunks: Iterator[list[Record]],
        sink: RecordSink,
        progress: Progress,
        span: Span,
    ) -> None:
        pending: dict[Future[Answers], tuple[list[Record], Span]] = {}
        for chunk in chunks:
            traced = _chunk_span(chunk, span)
            good = [r for r in chunk if r.error is None]
            if not good:
                self._write(sink, chunk, [], progress, traced)
                continue
            keys = [r.key for r in good]
            future = pool.submit([r.params for r in good], keys, traced.traceparent)
            pending[future] = (chunk, traced)
            while len(pending) >= IN_FLIGHT_PER_WORKER * self.workers:
                self._write_next(pending, sink, progress)
        while pending:
            self._write_next(pending, sink, progress)

    def _write_next(
        self,
        pending: dict[Future[Answers], tuple[list[Record], Span]],
        sink: RecordSink,
        progress: Progress,
    ) -> None:
        """Wait for a chunk in flight to come back, and write those that have."""
        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in finished:
            chunk, traced = pending.pop(future)
            self._write(sink, chunk, future.result(), progress, traced)

    def _write(
        self,
        sink: RecordSink,
        chunk: Sequence[Record],
        results: Answers,
        progress: Progress,
        span: Span = NO_SPAN,
    ) -> None:
        answers = iter(results)
        rows = []
        failed = 0
        for record in chunk:
            if record.error is not None:
                ok, data = False, encoding.dumps(record.error)
            else:
                ok, data = next(answers)
            rows.append(Row(record.id, record.key, data if ok else None, None if ok else data))
            failed += not ok
        sink.write(rows)
        self.tally.failed += failed
        self.tally.written += len(rows)
        progress.update(self.tally)
        span.set("serving.chunk_failed", failed)
        span.end()

    def _summary(self, sink: RecordSink, elapsed_s: float) -> None:
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
        if tally.skipped_failed and not tally.failed:
            log.warning(
                "exit status 1: %d records failed in an earlier run (this one wrote %s); "
                "their errors are in %s. A rerun skips every id written, failed ones too: "
                "add --retry-failed to predict them again",
                tally.skipped_failed,
                f"{tally.written} new records" if tally.written else "nothing",
                sink.where,
            )


def _chunk_span(chunk: Sequence[Record], run: Span) -> Span:
    """A chunk's span, under the run's: from its hand-out to its rows written."""
    if run is NO_SPAN:
        return NO_SPAN
    return tracer().start(
        "chunk", parent=run.traceparent, attributes={"serving.chunk_size": len(chunk)}
    )


def _interrupt(signum: int, frame: Any) -> None:
    # SIGTERM (a pod being deleted) ends the run like Ctrl-C: written chunks stay.
    raise KeyboardInterrupt
