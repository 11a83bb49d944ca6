"""One worker's serving state: the handler, its input validator and its batcher.

The HTTP layer is a thin adapter over ``Service.predict``; the CLI's ``check``
uses the same path. ``start`` runs after fork (it starts a thread), ``stop``
at worker exit. Imports no Flask.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import jsonschema

from . import arrival
from .batching import Batcher, Observer
from .dispatch import make_policy
from .errors import DeadlineExceeded, InvalidParams, NotReady
from .handler import InvalidInput, Output, Params, call_batch, handler_name, is_batched
from .loading import LoadedHandler
from .settings import Settings

log = logging.getLogger("serving_core.service")


class Service:
    def __init__(
        self,
        settings: Settings,
        loaded: LoadedHandler,
        *,
        observer: Observer | None = None,
    ) -> None:
        self.settings = settings
        self.loaded = loaded
        self.handler = loaded.handler
        self.name = handler_name(self.handler)
        self.batched = is_batched(type(self.handler))
        # Unbatched handlers run one item at a time through the same model
        # thread: fast tokenizers and many models are not thread-safe.
        self.max_batch_size = settings.max_batch_size if self.batched else 1
        schema = self.handler.input_schema
        self._validator = (
            None if schema is None else jsonschema.validators.validator_for(schema)(schema)
        )
        self._observer = observer
        self.batcher: Batcher | None = None

    # -- lifecycle ----------------------------------------------------------

    def start(self, *, warm_up: bool = True) -> None:
        """Per-worker start: ``setup_worker``, the model thread, then the sample as warm-up."""
        self.handler.setup_worker()
        policy = make_policy(
            self.settings.batch_policy,
            max_batch_size=self.max_batch_size,
            max_wait_ms=self.settings.max_wait_ms if self.batched else 0.0,
            open_connections=arrival.open_connections,
        )
        self.batcher = Batcher(
            lambda items: call_batch(self.handler, items),
            policy=policy,
            max_batch_size=self.max_batch_size,
            max_queue=self.settings.max_queue,
            observer=self._observer,
        )
        self.batcher.start()
        if warm_up and self.loaded.sample is not None:
            # Runs in the worker after fork: the first real request does not pay
            # for lazy initialisation, and a handler that breaks the contract
            # stops the worker at boot instead of failing requests.
            self.predict(dict(self.loaded.sample), request_id="warm-up")
            policy.cost.reset()

    def stop(self) -> bool:
        if self.batcher is None:
            return True
        return self.batcher.stop(self.settings.graceful_timeout_s)

    @property
    def ready(self) -> bool:
        return self.batcher is not None and self.batcher.alive

    # -- requests -----------------------------------------------------------

    def predict(
        self,
        params: Params,
        *,
        request_id: str,
        arrival: float | None = None,
        timeout_s: float | None = None,
    ) -> Output:
        """Validate, preprocess, batch, postprocess; raises ``ServingError`` subclasses."""
        if self.batcher is None:
            raise NotReady("the model is not loaded yet; retry after /readyz answers 200")
        now = time.monotonic()
        arrival = now if arrival is None else arrival
        limit = self.settings.request_timeout_s
        deadline = arrival + (limit if timeout_s is None else min(timeout_s, limit))
        if deadline <= now:
            self.batcher.rejected("deadline_passed")
            raise DeadlineExceeded(
                f"the request waited {now - arrival:.3f} s before reaching the app (in a proxy "
                "or the server's connection queue), past its deadline; retry later"
            )
        self.validate(params)
        try:
            item = self.handler.preprocess(params)
        except InvalidInput as exc:
            raise InvalidParams(str(exc)) from exc
        pending = self.batcher.submit(
            item, request_id=request_id, arrival=arrival, deadline=deadline
        )
        try:
            output = pending.future.result(timeout=max(0.0, deadline - time.monotonic()))
        except (FutureTimeout, CancelledError):
            pending.future.cancel()  # frees its slot if the model thread has not taken it
            raise DeadlineExceeded(
                f"no answer within the deadline of {deadline - arrival:.3f} s; "
                "retry later or ask for a longer timeout"
            ) from None
        except InvalidInput as exc:
            raise InvalidParams(str(exc)) from exc
        try:
            result: Output = self.handler.postprocess(output, params)
        except InvalidInput as exc:
            raise InvalidParams(str(exc)) from exc
        return result

    def validate(self, params: Params) -> None:
        if self._validator is None:
            return
        errors = sorted(self._validator.iter_errors(params), key=lambda e: list(e.path))
        if errors:
            fields = [
                {"field": "/".join(str(p) for p in e.path) or "(root)", "message": e.message}
                for e in errors
            ]
            raise InvalidParams(
                "; ".join(f"{f['field']}: {f['message']}" for f in fields), details=fields
            )

    def metadata(self) -> dict[str, Any]:
        batching: dict[str, Any] = {
            "batched": self.batched,
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
