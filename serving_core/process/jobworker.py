"""``serving-core worker``: the handler over the job queue, in batches, preloaded like ``serve``.

    master    Settings → import the handler → preload: setup() once (torch at one thread),
              gc.collect(), gc.freeze()
              → fork SERVING_WORKERS consumers → /metrics and /healthz on SERVING_BIND
              → a consumer that dies is forked again from the loaded master
    consumer  setup_worker(), torch threads = cores // workers, open the queue,
              then: take up to SERVING_MAX_BATCH_SIZE jobs → one Engine call
              → complete or fail each job

SIGTERM (or SIGINT) asks every consumer to stop: a consumer finishes the
batch in hand and exits; jobs it holds but has not started go back to the
queue at once. A consumer killed outright loses nothing either: its leased
jobs are handed out again when their lease runs out (at-least-once).

Our own small prefork loop rather than gunicorn's arbiter: gunicorn's workers
accept HTTP connections, and these take jobs. Imports no Flask.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

from serving_core.context import Context
from serving_core.engine.core import Engine, Result
from serving_core.errors import ServingError
from serving_core.jobs.backend import open_queue
from serving_core.jobs.base import Job, JobQueue
from serving_core.loading import LoadedHandler
from serving_core.metrics.core import CONTENT_TYPE, Metrics
from serving_core.metrics.directory import exposition
from serving_core.preload import preload
from serving_core.settings import Settings
from serving_core.threads import set_worker_threads

log = logging.getLogger("serving_core.process.jobworker")

TAKE_WAIT_S = 1.0  # how long a take blocks: the longest a stop request waits to be seen
RESPAWN_PAUSE_S = 1.0  # between forks of a consumer that keeps dying at start


@dataclass
class Consumer:
    """One process's loop: take a batch, run it, store what came out."""

    engine: Engine
    queue: JobQueue
    name: str
    max_batch_size: int
    stopping: Callable[[], bool]
    observer: Callable[[int, int], None] = field(default=lambda done, failed: None)
    # Each taken job's wait in the queue (submitted to started): the queue's lag.
    on_taken: Callable[[list[float]], None] = field(default=lambda waits: None)
    # SERVING_JOBS_LEASE_S: a batch running longer renews its jobs' leases every
    # third of it, so a slow model is not mistaken for a dead consumer (its jobs
    # handed out again, and failed once their attempts ran out). None: never.
    lease_s: float | None = None

    def run(self) -> None:
        while not self.stopping():
            jobs = self.queue.take(self.name, self.max_batch_size, TAKE_WAIT_S)
            if jobs:
                self.on_taken([_waited(job) for job in jobs])
                self.run_batch(jobs)

    def run_batch(self, jobs: list[Job]) -> None:
        contexts = [Context(job.id) for job in jobs]
        with self._renewing(jobs):
            try:
                results = self.engine.predict_many([job.params for job in jobs], contexts)
            except BaseException:
                # Not the handler's error (those are per job): hand the batch back untouched.
                self.queue.release(jobs)
                raise
            if len(jobs) > 1:
                results = self._isolate(jobs, contexts, results)
        finished: list[tuple[Job, Result]] = []
        failed = 0
        for job, result in zip(jobs, results, strict=True):
            if isinstance(result, ServingError):
                self.queue.fail(job, result.body()["error"], retry=result.status >= 500)
                failed += 1
            else:
                finished.append((job, result))
        # The whole batch's results in one commit (SQLite) or round trip (Redis): a
        # commit per job cost about 5% of MiniLM's jobs/s.
        self.queue.complete_many(finished)
        self.observer(len(finished), failed)

    @contextlib.contextmanager
    def _renewing(self, jobs: list[Job]) -> Iterator[None]:
        if self.lease_s is None:
            yield
            return
        done = threading.Event()
        interval_s = self.lease_s / 3

        def renew() -> None:
            while not done.wait(interval_s):
                try:
                    self.queue.renew(self.name, jobs)
                except Exception:  # the queue is down: the next renewal may get through
                    log.warning("could not renew the leases of %d jobs", len(jobs), exc_info=True)

        renewer = threading.Thread(target=renew, name="serving-lease-renewer", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            done.set()
            renewer.join()

    def _isolate(
        self, jobs: list[Job], contexts: list[Context], results: list[Result]
    ) -> list[Result]:
        """A model failure fails every job of its batch; run those jobs again one at a
        time, so that one poison job fails alone and its batch-mates are not retried
        with it until they become dead letters too."""
        failed = [
            i for i, r in enumerate(results) if isinstance(r, ServingError) and r.status >= 500
        ]
        if len(failed) < 2:
            return results
        results = list(results)
        for i in failed:
            results[i] = self.engine.predict_many([jobs[i].params], [contexts[i]])[0]
        return results


def _waited(job: Job) -> float:
    """Seconds from submission to this attempt's start (both stamped by the queue)."""
    return max(0.0, (job.started_at or job.created_at) - job.created_at)


class Master:
    """Forks the consumers from the loaded handler and keeps them running."""

    def __init__(self, settings: Settings, loaded: LoadedHandler) -> None:
        self.settings = settings
        self.loaded = loaded
        self.children: dict[int, int] = {}  # pid -> slot
        self.stopping = False

    def run(self) -> int:
        if self.settings.bind.startswith("unix:"):
            raise ValueError(
                f"SERVING_BIND={self.settings.bind}: serving-core worker serves /healthz and "
                "/metrics over TCP; set SERVING_BIND=0.0.0.0:9090 (or 127.0.0.1:PORT)"
            )
        preload(self.loaded.handler)  # as serve and batch do
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for slot in range(self.settings.workers):
            self._fork(slot)
        # After the first forks, so they start without its thread (a respawned
        # consumer forks beside it, and never touches it).
        server = _health_server(self, self.settings.bind)
        log.info(
            "serving-core worker: %d consumer(s) of queue %r",
            self.settings.workers,
            self.loaded.handler.name or type(self.loaded.handler).__name__.lower(),
        )
        while self.children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            slot = self.children.pop(pid, -1)
            if slot < 0:
                continue
            if not self.stopping:
                log.warning("consumer %d exited (status %d); starting another", pid, status)
                time.sleep(RESPAWN_PAUSE_S)
                self._fork(slot)
        server.shutdown()
        return 0

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            return
        self.stopping = True
        log.info("stopping: each consumer finishes the batch in hand")
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        # The graceful timeout bounds the drain: then the rest are killed (their
        # leases bring their jobs back).
        signal.signal(signal.SIGALRM, self._kill)
        signal.setitimer(signal.ITIMER_REAL, max(0.001, self.settings.graceful_timeout_s))

    def _kill(self, signum: int, frame: FrameType | None) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _fork(self, slot: int) -> None:
        pid = os.fork()
        if pid:
            self.children[pid] = slot
            return
        code = 1
        try:
            code = self._consume(slot)
        except BaseException:
            log.exception("consumer %d failed", os.getpid())
        finally:
            os._exit(code)

    def _consume(self, slot: int) -> int:
        stop = {"asked": False}

        def asked(signum: int, frame: FrameType | None) -> None:
            stop["asked"] = True

        signal.signal(signal.SIGTERM, asked)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the master decides; Ctrl-C reaches all
        set_worker_threads(self.settings.workers)
        self.loaded.handler.setup_worker()
        metrics = Metrics()
        engine = Engine(
            self.loaded.handler,
            max_batch_size=self.settings.max_batch_size,
            on_failure=metrics.failed,
        )
        queue = open_queue(self.settings, engine.name)
        try:
            Consumer(
                engine,
                queue,
                name=f"{socket.gethostname()}-{os.getpid()}",
                max_batch_size=engine.max_batch_size,
                stopping=lambda: stop["asked"],
                observer=metrics.jobs_finished,
                on_taken=metrics.jobs_taken,
                lease_s=self.settings.jobs_lease_s,
            ).run()
        finally:
            queue.close()
        return 0


class _Health(http.server.BaseHTTPRequestHandler):
    master: Master

    def do_GET(self) -> None:
        if self.path == "/healthz":
            alive = len(self.master.children)
            status = 200 if alive and not self.master.stopping else 503
            body = json.dumps({"consumers": alive, "stopping": self.master.stopping}).encode()
            self._send(status, "application/json", body)
        elif self.path == "/metrics":
            self._send(200, CONTENT_TYPE, exposition())
        else:
            self._send(404, "application/json", b'{"error": {"type": "not_found"}}')

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the probes would be most of the log


def _health_server(master: Master, bind: str) -> http.server.ThreadingHTTPServer:
    """/healthz (200 while consumers run) and /metrics, on SERVING_BIND, in a thread."""
    host, _, port = bind.rpartition(":")
    handler = type("Health", (_Health,), {"master": master})
    server = http.server.ThreadingHTTPServer((host.strip("[]"), int(port)), handler)
    threading.Thread(target=server.serve_forever, name="serving-health", daemon=True).start()
    return server
