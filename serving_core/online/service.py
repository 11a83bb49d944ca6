"""One worker's online path: admission and deadlines around a runner that runs the
model, and the cache and the job queues it opens (the front door, ``door``, answers
through them).

``prepare`` and ``finish`` (validation, pre- and postprocessing) run where the
request runs; the model call runs where the runner says (``runner``: the
worker's model thread, the shared model process, or the request itself for a
``concurrent`` handler), chosen once in ``start``. ``start`` runs after fork
and takes what only the worker knows: how many connections it holds and what
a waiting request waits on. ``stop`` runs at worker exit. Imports no Flask.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from serving_core import threads
from serving_core.cache.cache import Cache, CacheObserver, from_settings
from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.engine.observer import GenerationObserver, Observer
from serving_core.engine.watchdog import Verdict, Watchdog
from serving_core.errors import DeadlineExceeded, InvalidParams, Overloaded
from serving_core.handler import Output, Params
from serving_core.loading import LoadedHandler
from serving_core.online import deadlines
from serving_core.online.jobsapi import JobsApi
from serving_core.online.runner.base import (
    ClientWatch,
    Computed,
    Runner,
    Unstarted,
    WatchGone,
    not_loaded,
)
from serving_core.online.runner.choice import runner_for
from serving_core.online.runner.decoding import DecodingRunner
from serving_core.online.streamed import Streamed
from serving_core.payloads.logger import PayloadLog
from serving_core.runtime import THREADS, Runtime
from serving_core.settings import Settings
from serving_core.tracing.tracer import tracer

# The worker's way to notice a client hanging up: (its socket, what to do then)
# -> what stops watching.
WatchClient = Callable[[Any, Callable[[], None]], ClientWatch]


class Service:
    def __init__(
        self,
        settings: Settings,
        loaded: LoadedHandler,
        engine: Engine,
        *,
        observer: Observer | None = None,
        cache_observer: CacheObserver | None = None,
        generation_observer: GenerationObserver | None = None,
        model_sockets: Sequence[str] = (),
        runtime: Runtime = THREADS,
        payloads: PayloadLog | None = None,
    ) -> None:
        """``model_sockets``: the shared model processes' sockets (SERVING_MODEL_PROCESS=
        shared; one per GPU); the model runs there, not on a model thread of this worker.
        ``runtime``: how this worker's requests wait (threads, or the gevent worker's
        greenlets). ``payloads``: the payload log the front door offers each exchange to
        (None: off), started here after fork."""
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
        self._generation_observer = generation_observer
        self.generates = engine.stepper is not None
        self.model_sockets = list(model_sockets)
        self.runner: Runner = Unstarted()  # chosen in start()
        self.cache: Cache | None = None  # opened in start(): a Redis pool per process
        self.jobs = JobsApi(settings, engine)  # opened in start(), after fork
        self.draining = False  # SIGTERM: /readyz answers 503 while requests are still served
        self.watchdog: Watchdog | None = None
        self._watch_client: WatchClient | None = None
        self.payloads = payloads

    # -- lifecycle ----------------------------------------------------------

    def start(
        self,
        *,
        warm_up: bool = True,
        open_connections: Callable[[], int | None] = lambda: None,
        on_verdict: Callable[[Verdict], None] | None = None,
        watch_client: WatchClient | None = None,
    ) -> None:
        """Per-worker start: ``setup_worker``, the runner, then the sample as warm-up
        (where the model runs in this worker).

        ``open_connections``: the worker's open client connections (each may still
        send a request), for the adaptive policy; ``on_verdict``: how the worker
        leaves when its watchdog says it should (None: no watchdog).
        """
        self._watch_client = watch_client
        self.handler.setup_worker()
        self.cache = from_settings(
            self.settings, self.handler, self._cache_observer, self.runtime.new_future
        )
        self.jobs.open()
        if self.payloads is not None:
            self.payloads.start()
        self.runner = runner_for(
            self.settings,
            self.engine,
            observer=self._observer,
            generation_observer=self._generation_observer,
            model_sockets=self.model_sockets,
            open_connections=open_connections,
            runtime=self.runtime,
        )
        sample = self.loaded.sample
        self.runner.start(
            (lambda: self.predict(dict(sample), request_id="warm-up"))
            if warm_up and sample is not None
            else None
        )
        if on_verdict is not None:
            self.watchdog = Watchdog(
                self.runner.model_thread,
                hang_margin_s=self.settings.hang_margin_s,
                max_rss_bytes=self.settings.max_rss_bytes,
                on_verdict=on_verdict,
            )
            self.watchdog.start()

    def stop(self) -> bool:
        """At worker exit: False if the requests in hand did not finish in time."""
        self.jobs.close()
        if self.watchdog is not None:
            self.watchdog.stop()
        finished = self.runner.stop(self.settings.graceful_timeout_s)
        if self.payloads is not None:
            self.payloads.stop()  # after the runner: the last answers' events too
        return finished

    @property
    def fault(self) -> str | None:
        """Why the model thread was given up (hung or dead), or None."""
        return self.runner.fault

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
        return self.runner.ready and self.handler.ready()

    # -- requests -----------------------------------------------------------

    def admit(self, *, arrival: float | None = None, timeout_s: float | None = None) -> None:
        """Raise now what ``predict`` would raise at once for a request that arrived at
        ``arrival`` (not ready, past its deadline, a full queue, predicted late), from
        what is known before its body is read; queues nothing. ``predict`` asks again."""
        try:
            self.runner.admit(self._live_deadline(arrival, timeout_s))
        except Overloaded as exc:
            raise self._own_deadline_too_short(exc, timeout_s) from None

    def predict(
        self,
        params: Params,
        *,
        request_id: str,
        arrival: float | None = None,
        timeout_s: float | None = None,
    ) -> Output:
        """Prepare, run, finish, around no cache; raises ``ServingError`` subclasses."""
        computed = self.compute(params, request_id=request_id, arrival=arrival, timeout_s=timeout_s)
        output: Output = computed.output
        return output

    def compute(
        self,
        params: Params,
        *,
        request_id: str,
        arrival: float | None = None,
        timeout_s: float | None = None,
        client: Any = None,
        alone: Callable[[], bool] = lambda: True,
    ) -> Computed:
        """``predict``'s output, and the size of the batch it ran in. ``client``: the request's
        connection, watched while it waits (the gevent worker's ``watch_client``): a
        client that hangs up takes its item out of the queue, when it is ``alone`` in
        waiting for it (the cache may have others wait on it)."""
        ctx, arrival = self._context(request_id, arrival, timeout_s)
        # A worker with a request in hand lends its core to no sibling (``threads``):
        # between its batches its hub still reads, prepares and answers.
        with threads.busy():
            item = self.engine.prepare(params, ctx)
            watch = self._watch(client, alone)
            runner = self.runner
            if isinstance(runner, DecodingRunner):
                limit = self.engine.token_limit(params)
                chunks = runner.generate(item, ctx, arrival=arrival, max_tokens=limit, watch=watch)
                output, batch_size = self.engine.collect(chunks, ctx), None
            else:
                try:
                    output, batch_size = runner.run(item, ctx, arrival=arrival, watch=watch)
                except Overloaded as exc:
                    raise self._own_deadline_too_short(exc, timeout_s) from None
            return Computed(self.engine.finish(output, params, ctx), batch_size)

    def stream(
        self,
        params: Params,
        *,
        request_id: str,
        arrival: float | None = None,
        timeout_s: float | None = None,
        client: Any = None,
    ) -> Streamed:
        """A generating handler's chunks as they come, its first event already in
        (``Streamed.start``): an error before any chunk is raised here. Raises
        ``InvalidParams`` for a handler that does not generate."""
        runner = self.runner
        if not isinstance(runner, DecodingRunner):
            raise InvalidParams(
                f"{self.name} answers in one piece, not in chunks; ask without a stream "
                "(no Accept: text/event-stream, no stream: true)"
            )
        ctx, arrival = self._context(request_id, arrival, timeout_s)
        item = self.engine.prepare(params, ctx)
        limit = self.engine.token_limit(params)
        return Streamed.open(
            runner,
            item,
            ctx,
            arrival=arrival,
            max_tokens=limit,
            watch=self._watch(client, lambda: True),
        )

    def _context(
        self, request_id: str, arrival: float | None, timeout_s: float | None
    ) -> tuple[Context, float]:
        """The request's context (its deadline checked) and its arrival."""
        deadline = self._live_deadline(arrival, timeout_s)
        arrival = time.monotonic() if arrival is None else arrival
        # The request's span, current here: the batch's span links to it.
        return Context(request_id, deadline, tracer().current()), arrival

    def _watch(self, client: Any, alone: Callable[[], bool]) -> WatchGone | None:
        watch_client = self._watch_client
        if client is None or watch_client is None:
            return None

        def watch(withdraw: Callable[[], None]) -> ClientWatch:
            def gone() -> None:
                if alone():
                    withdraw()

            watching = watch_client(client, gone)
            return ClientWatch(watching.stop, lambda: alone() and watching.gone_now())

        return watch

    def _live_deadline(self, arrival: float | None, timeout_s: float | None) -> float:
        """The request's deadline; raises if it cannot be served at all or is late already."""
        if not self.runner.started:
            raise not_loaded()
        now = time.monotonic()
        arrival = now if arrival is None else arrival
        deadline = self.deadline(arrival, timeout_s)
        if deadline <= now:
            if self._observer is not None:
                self._observer.rejected("deadline_passed")
            raise deadlines.passed(arrival, timeout_s, self.settings.request_timeout_s, now)
        return deadline

    def _own_deadline_too_short(
        self, refusal: Overloaded, timeout_s: float | None
    ) -> Overloaded | DeadlineExceeded:
        return deadlines.as_heard(refusal, timeout_s, self.settings.request_timeout_s)

    def deadline(self, arrival: float | None, timeout_s: float | None) -> float:
        """When a request that arrived at ``arrival`` is due: its own timeout, capped by
        SERVING_REQUEST_TIMEOUT_S."""
        return deadlines.due(arrival, timeout_s, self.settings.request_timeout_s)

    def metadata(self) -> dict[str, Any]:
        batching: dict[str, Any] = {
            "batched": self.batched,
            "generates": self.generates,
            "concurrent": self.handler.concurrent,
            "max_batch_size": self.max_batch_size,
            "max_queue": self.settings.max_queue,
            "request_timeout_s": self.settings.request_timeout_s,
            **self.runner.describe(),
        }
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
