"""One worker's online path: the engine behind a batcher, with admission and deadlines.

``prepare`` and ``finish`` (validation, pre- and postprocessing) run where the
request runs; the model call runs on the worker's model thread, which the
batcher feeds. A ``concurrent`` handler (a pipeline) has no batcher: its
``predict`` runs where the request runs, at most ``SERVING_MAX_QUEUE`` at once.
``start`` runs after fork (it starts that thread) and takes
what only the worker knows: how many connections it holds and what a waiting
request waits on. ``stop`` runs at worker exit. Imports no Flask.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from serving_core import context
from serving_core.cache.core import Cache, CacheObserver, CacheResult, from_settings
from serving_core.context import Context
from serving_core.engine.batcher import Batcher
from serving_core.engine.core import Engine
from serving_core.engine.observer import Observer
from serving_core.engine.policy import make_policy
from serving_core.engine.watchdog import Verdict, Watchdog
from serving_core.errors import (
    Conflict,
    DeadlineExceeded,
    NotFound,
    NotReady,
    Overloaded,
    ServingError,
)
from serving_core.handler import Output, Params
from serving_core.jobs import liveness
from serving_core.jobs.backend import open_queue
from serving_core.jobs.base import Job, JobQueue, QueueFull, QueueUnavailable
from serving_core.loading import LoadedHandler
from serving_core.modelprocess.client import RemoteBatcher
from serving_core.runtime import THREADS, Runtime
from serving_core.settings import Settings

log = logging.getLogger("serving_core.online.service")

# The worker's way to notice a client hanging up: (its socket, what to do then)
# -> what stops watching.
WatchClient = Callable[[Any, Callable[[], None]], Callable[[], None]]


class Service:
    def __init__(
        self,
        settings: Settings,
        loaded: LoadedHandler,
        engine: Engine,
        *,
        observer: Observer | None = None,
        cache_observer: CacheObserver | None = None,
        model_sockets: Sequence[str] = (),
        runtime: Runtime = THREADS,
    ) -> None:
        """``model_sockets``: the shared model processes' sockets (SERVING_MODEL_PROCESS=
        shared; one per GPU); the model runs there, not on a model thread of this worker.
        ``runtime``: how this worker's requests wait (threads, or the gevent worker's
        greenlets)."""
        self.settings = settings
        self.runtime = runtime
        self.loaded = loaded
        self.engine = engine
        self.handler = loaded.handler
        self.name = engine.name
        self.batched = engine.batched
        self.max_batch_size = engine.max_batch_size
        self._observer = observer
        self._cache_observer = cache_observer
        self.batcher: Batcher | RemoteBatcher | None = None
        self.model_sockets = list(model_sockets)
        self.cache: Cache | None = None  # opened in start(): a Redis pool per process
        # Opened in start(), after fork: neither a SQLite connection nor a Redis
        # pool may be shared by forked processes.
        self.jobs: JobQueue | None = None
        self.followup: JobQueue | None = None
        # A concurrent handler's requests in flight in this worker (no batcher).
        self.concurrent = loaded.handler.concurrent
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        self._serving = False
        self.draining = False  # SIGTERM: /readyz answers 503 while requests are still served
        self.watchdog: Watchdog | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(
        self,
        *,
        warm_up: bool = True,
        open_connections: Callable[[], int | None] = lambda: None,
        on_verdict: Callable[[Verdict], None] | None = None,
        watch_client: WatchClient | None = None,
    ) -> None:
        """Per-worker start: ``setup_worker``, the model thread, then the sample as warm-up.

        ``open_connections``: the worker's open client connections (each may still
        send a request), for the adaptive policy; ``on_verdict``: how the worker
        leaves when its watchdog says it should (None: no watchdog).
        """
        self._watch_client = watch_client
        self.handler.setup_worker()
        self.cache = from_settings(
            self.settings, self.handler, self._cache_observer, self.runtime.new_future
        )
        if self.settings.jobs_enabled:
            self.jobs = open_queue(self.settings, self.name)
        if self.settings.followup_queue:
            self.followup = open_queue(self.settings, self.settings.followup_queue)
        if self.concurrent:
            # No model thread to start or warm: predict runs in the requests. (Nor
            # is the sample run: a pipeline's stages may start after it does.)
            self._serving = True
            self._watch(on_verdict)
            return
        if self.model_sockets:
            # The model process batches, warms up and applies admission; this
            # worker validates, preprocesses and postprocesses as always.
            self.batcher = RemoteBatcher(
                self.model_sockets,
                max_queue=self.settings.max_queue,
                observer=self._observer,
                open_connections=open_connections,
                runtime=self.runtime,
            )
            self.batcher.start()
            self._watch(on_verdict)
            return
        policy = make_policy(
            self.settings.batch_policy,
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.settings.max_wait_ms if self.batched else 0.0,
            open_connections=open_connections,
        )
        self.batcher = Batcher(
            self.engine.run,
            policy=policy,
            max_batch_size=self.max_batch_size,
            max_queue=self.settings.max_queue,
            observer=self._observer,
        )
        self.batcher.new_future = self.runtime.new_future
        self.batcher.defer_wake = self.runtime.defer_wake
        self.batcher.start()
        if warm_up and self.loaded.sample is not None:
            # Runs in the worker after fork: the first real request does not pay
            # for lazy initialisation, and a handler that breaks the contract
            # stops the worker at boot instead of failing requests.
            try:
                self.predict(dict(self.loaded.sample), request_id="warm-up")
            except BaseException:
                # The model thread may still be in the sample: exit without waiting.
                self.batcher.abandon("the warm-up failed")
                raise
            policy.cost.reset()
        self._watch(on_verdict)

    def _watch(self, on_verdict: Callable[[Verdict], None] | None) -> None:
        if on_verdict is None:
            return
        self.watchdog = Watchdog(
            # The shared model process has no model thread here to watch: only
            # this worker's memory is.
            self.batcher if isinstance(self.batcher, Batcher) else None,
            hang_margin_s=self.settings.hang_margin_s,
            max_rss_bytes=self.settings.max_rss_bytes,
            on_verdict=on_verdict,
        )
        self.watchdog.start()

    def stop(self) -> bool:
        for queue in (self.jobs, self.followup):
            if queue is not None:
                queue.close()
        self._serving = False
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.batcher is None:
            return True
        return self.batcher.stop(self.settings.graceful_timeout_s)

    @property
    def fault(self) -> str | None:
        """Why the model thread was given up (hung or dead), or None."""
        return self.batcher.fault if self.batcher is not None else None

    def drain(self) -> None:
        """The worker got SIGTERM: say not ready, so that balancers stop sending,
        and serve on (``drain``, in the process layer, says for how long)."""
        self.draining = True

    @property
    def ready(self) -> bool:
        if self.draining:
            return False
        if self.watchdog is not None and self.watchdog.verdict is not None:
            return False  # on its way out
        if self.concurrent:
            return self._serving and self.handler.ready()
        return self.batcher is not None and self.batcher.alive and self.handler.ready()

    # -- requests -----------------------------------------------------------

    def predict(
        self,
        params: Params,
        *,
        request_id: str,
        arrival: float | None = None,
        timeout_s: float | None = None,
        client: Any = None,
        alone: Callable[[], bool] = lambda: True,
    ) -> Output:
        """Prepare, batch, finish; raises ``ServingError`` subclasses. ``client``: the
        request's connection, watched while it waits (the gevent worker's
        ``watch_client``): a client that hangs up takes its item out of the queue,
        when it is ``alone`` in waiting for it (the cache may have others wait on it)."""
        deadline = self._live_deadline(arrival, timeout_s)
        arrival = time.monotonic() if arrival is None else arrival
        ctx = Context(request_id, deadline)
        if self.batcher is None:
            return self._predict_here(params, ctx)
        item = self.engine.prepare(params, ctx)
        batcher = self.batcher
        pending = batcher.submit(item, ctx, arrival=arrival)

        def gone() -> None:
            if alone():
                batcher.withdraw(pending)

        unwatch = (
            self._watch_client(client, gone)
            if client is not None and self._watch_client is not None
            else None
        )
        try:
            output = pending.future.result(timeout=max(0.0, deadline - time.monotonic()))
        except (FutureTimeout, CancelledError):
            batcher.withdraw(pending)  # frees its slot if the model thread has not taken it
            raise DeadlineExceeded(
                f"no answer within the deadline of {deadline - arrival:.3f} s; "
                "retry later or ask for a longer timeout"
            ) from None
        finally:
            if unwatch is not None:
                unwatch()
        context.note_batch_size(pending.batch_size)
        return self.engine.finish(output, params, ctx)

    def admit(self, *, arrival: float | None = None, timeout_s: float | None = None) -> None:
        """Raise now what ``predict`` would raise at once for a request that arrived at
        ``arrival`` (not ready, past its deadline, a full queue, predicted late), from
        what is known before its body is read; queues nothing. ``predict`` asks again."""
        deadline = self._live_deadline(arrival, timeout_s)
        if self.batcher is not None:
            self.batcher.admit(deadline)
        elif self._in_flight >= self.settings.max_queue:
            self._rejected("queue_full")
            raise self._full()

    def _live_deadline(self, arrival: float | None, timeout_s: float | None) -> float:
        """The request's deadline; raises if it cannot be served at all or is late already."""
        if self.batcher is None and not (self.concurrent and self._serving):
            raise NotReady("the model is not loaded yet; retry after /readyz answers 200")
        now = time.monotonic()
        arrival = now if arrival is None else arrival
        deadline = self._deadline(arrival, timeout_s)
        if deadline <= now:
            self._rejected("deadline_passed")
            raise DeadlineExceeded(
                f"the request waited {now - arrival:.3f} s before reaching the app (in a proxy "
                "or the server's connection queue), past its deadline; retry later"
            )
        return deadline

    def _full(self) -> Overloaded:
        return Overloaded(
            f"{self._in_flight} requests are in flight in this worker "
            f"(SERVING_MAX_QUEUE={self.settings.max_queue}); retry after the "
            "Retry-After delay",
            reason="queue_full",
            retry_after_s=1.0,
        )

    def _predict_here(self, params: Params, ctx: Context) -> Output:
        """A concurrent handler: every step in this request, at most max_queue at once."""
        with self._in_flight_lock:
            if self._in_flight >= self.settings.max_queue:
                self._rejected("queue_full")
                raise self._full()
            self._in_flight += 1
        try:
            item = self.engine.prepare(params, ctx)
            (result,) = self.engine.run([item], [ctx]).results
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1
        if isinstance(result, ServingError):
            raise result
        return self.engine.finish(result, params, ctx)

    def _rejected(self, reason: str) -> None:
        if self.batcher is not None:
            self.batcher.rejected(reason)
        elif self._observer is not None:
            self._observer.rejected(reason)

    def answer(
        self,
        params: Params,
        *,
        request_id: str,
        arrival: float | None = None,
        timeout_s: float | None = None,
        client: Any = None,
    ) -> tuple[Output, CacheResult | None]:
        """``/predict``: the answer, from the inference cache when it has it, and how the
        cache served it (None: not cached). With a follow-up queue (the time-lag
        pattern), the same request is queued for the slow handler too."""
        if self.cache is not None and (key := self.cache.key_for(params)) is not None:
            cache = self.cache

            def compute() -> Output:
                return self.predict(
                    params,
                    request_id=request_id,
                    arrival=arrival,
                    timeout_s=timeout_s,
                    client=client,
                    alone=lambda: not cache.followed(key),
                )

            # A request waiting for an identical one in flight waits no longer
            # than its own deadline.
            wait_s = self._deadline(arrival, timeout_s) - time.monotonic()
            try:
                output, served = cache.single_flight(key, compute, timeout_s=max(0.0, wait_s))
            except TimeoutError:
                raise DeadlineExceeded(
                    "no answer within the deadline (an identical request in flight had none "
                    "yet); retry later or ask for a longer timeout"
                ) from None
        else:
            output = self.predict(
                params, request_id=request_id, arrival=arrival, timeout_s=timeout_s, client=client
            )
            served = None
        return self._follow_up(output, params, request_id), served

    def _follow_up(self, output: Output, params: Params, request_id: str) -> Output:
        if self.followup is None:
            return output
        try:
            job = self.followup.submit(params)
        except (QueueFull, QueueUnavailable) as exc:
            # The fast answer stands on its own; say why there is no slow one.
            log.warning("request %s: the follow-up was not queued: %s", request_id, exc)
            return {**output, "job_id": None, "job_error": f"not queued: {exc}"}
        return {**output, "job_id": job.id, "status_url": status_url(job.id)}

    def _deadline(self, arrival: float | None, timeout_s: float | None) -> float:
        limit = self.settings.request_timeout_s
        start = time.monotonic() if arrival is None else arrival
        return start + (limit if timeout_s is None else min(timeout_s, limit))

    # -- jobs ---------------------------------------------------------------

    def submit_job(self, params: Params, *, idempotency_key: str | None) -> Job:
        """Queue ``params`` for this handler's workers; a bad request is a 400 now, not a
        failed job later."""
        queue = self._jobs()
        self.engine.validate(params)
        try:
            return queue.submit(params, idempotency_key=idempotency_key)
        except QueueFull as exc:
            raise Overloaded(
                f"the job queue is full (SERVING_JOBS_MAX_QUEUE={self.settings.jobs_max_queue}); "
                "retry after the Retry-After delay",
                reason="jobs_full",
                retry_after_s=exc.retry_after_s,
            ) from None
        except QueueUnavailable as exc:
            raise NotReady(f"the job queue is unavailable ({exc}); retry shortly") from None

    @property
    def job_queues(self) -> list[JobQueue]:
        """The queues this worker has opened: its own jobs' and the follow-up one."""
        return [queue for queue in (self.jobs, self.followup) if queue is not None]

    def job(self, job_id: str) -> Job:
        queues = self.job_queues
        if not queues:
            raise NotReady("this worker has not opened its job queue yet; retry shortly")
        for queue in queues:
            try:
                found = queue.get(job_id)
            except QueueUnavailable as exc:
                raise NotReady(f"the job queue is unavailable ({exc}); retry shortly") from None
            if found is not None:
                return found
        raise NotFound(
            f"no job {job_id!r}: it never existed, or it finished more than "
            f"SERVING_JOBS_TTL_S={self.settings.jobs_ttl_s:g} s ago and its result expired"
        )

    def job_hint(self, job: Job) -> str | None:
        """For a queued job whose queue no consumer polls: how to get it run."""
        queue = self._queue_of(job)
        if job.status != "queued" or queue is None:
            return None
        handler = self.settings.handler if queue is self.jobs else None
        return liveness.hint(queue, self.settings, handler=handler)

    def _queue_of(self, job: Job) -> JobQueue | None:
        return self.followup if job.queue != self.name and self.followup else self.jobs

    def cancel_job(self, job_id: str) -> Job:
        job = self.job(job_id)  # 404 for an unknown id, from either queue
        queue = self._queue_of(job)
        if queue is None:
            raise NotReady("this worker has not opened its job queue yet; retry shortly")
        try:
            after = queue.cancel(job_id)
        except QueueUnavailable as exc:
            raise NotReady(f"the job queue is unavailable ({exc}); retry shortly") from None
        if after is None:
            raise NotFound(f"no job {job_id!r}")
        if after.status != "cancelled":
            raise Conflict(f"job {job_id} is {after.status}: only a queued job can be cancelled")
        return after

    def _jobs(self) -> JobQueue:
        if self.jobs is None:
            raise NotReady("this worker has not opened its job queue yet; retry shortly")
        return self.jobs

    def metadata(self) -> dict[str, Any]:
        batching: dict[str, Any] = {
            "batched": self.batched,
            "concurrent": self.concurrent,
            "max_batch_size": self.max_batch_size,
            "max_queue": self.settings.max_queue,
            "request_timeout_s": self.settings.request_timeout_s,
        }
        if self.batcher is not None:
            batching.update(self.batcher.policy.describe())
            batching["queue_depth"] = self.batcher.depth
        return {
            "name": self.name,
            "version": self.handler.version,
            "handler": self.loaded.source,
            "input_schema": self.handler.input_schema,
            "batching": batching,
            "workers": self.settings.workers,
            "worker_class": self.settings.worker_class,
            "worker_connections": self.settings.worker_connections,
            "threads": self.settings.threads,
        }


def status_url(job_id: str) -> str:
    return f"/jobs/{job_id}"
