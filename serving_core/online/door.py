"""The front door: the one sequence every front runs a request through, and its records.

A front (``/predict``, the V2 routes over REST and gRPC, and any route after
them) parses what it can without reading the body into a ``Head``, then calls
``FrontDoor.enter`` with a way to read the body and a way to answer it:

1. a ``Content-Length`` over SERVING_MAX_BODY_BYTES is a ``413``, unread: the
   client's fault comes before the server's;
2. admission (``Service.admit``): not loaded, past its deadline, a full queue
   or a predicted miss is refused now (``503`` or ``504``), still unread;
3. the body is read (``read``) and answered (``answer``): ``FrontDoor.answer``
   for one set of parameters, through the cache and the follow-up; a
   protocol's own (V2's ``Model.infer``, one ``answer`` per row).

With traces on, admission and the read are spans under the front's span of the
request, and the answer's (``queue``, the batch's ``model``) follow from it.
What comes back is an ``Answered``: the output, how the cache served it and
the size of the batch the model ran it in, for the front's access line. Imports
no Flask and no grpc: the reading of headers, deadlines and sockets is each
front's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from serving_core.cache.cache import CacheResult
from serving_core.errors import DeadlineExceeded, PayloadTooLarge, ServingError, too_large
from serving_core.handler import Output, Params
from serving_core.online.service import Service
from serving_core.online.streamed import Streamed
from serving_core.tracing.tracer import tracer

T = TypeVar("T")
Read = TypeVar("Read")
Reply = TypeVar("Reply")


@dataclass(frozen=True, slots=True)
class Head:
    """What a front knows of a request before its body is read."""

    request_id: str
    arrival: float  # time.monotonic() seconds: when it reached the server (or its proxy)
    timeout_s: float | None = None  # the client's own (X-Request-Timeout, a gRPC deadline)
    content_length: int | None = None  # None: not known before reading (chunked, gRPC)
    caller: str = ""  # the API key's identity (``web.guard.caller``); "" without keys
    client: Any = None  # the connection, watched for a hang-up while the request waits


@dataclass(frozen=True, slots=True)
class Answered(Generic[T]):
    """A request's answer, and what its front's access line tells of it."""

    output: T
    served: CacheResult | None = None  # how the cache served it; None: not cached
    batch_size: int | None = None  # the model's batch that ran it; None: no model call here


class FrontDoor:
    def __init__(self, service: Service) -> None:
        # Public for the protocols over the door (``v2.model``): what they describe.
        self.service = service
        settings = service.settings
        self._max_body_bytes = settings.max_body_bytes
        self._cache_header = settings.cache_header
        self._cache_per_key = settings.cache_per_key

    def enter(
        self,
        head: Head,
        read: Callable[[], Read],
        answer: Callable[[Read, Head], Reply],
    ) -> Reply:
        """Refuse what the head alone refuses, then read the body and answer it."""
        length = head.content_length
        if length is not None and length > self._max_body_bytes:
            raise PayloadTooLarge(too_large(self._max_body_bytes))
        traces = tracer()
        if not traces.enabled:
            # From the head alone: a full worker spends nothing on a body it would refuse.
            self.service.admit(arrival=head.arrival, timeout_s=head.timeout_s)
            return answer(read(), head)
        # The same steps, each a span under the front's own (the request's).
        with traces.span("admission"):
            self.service.admit(arrival=head.arrival, timeout_s=head.timeout_s)
        with traces.span("read"):
            body = read()
        return answer(body, head)

    def predict(self, head: Head, read: Callable[[], Params]) -> Answered[Output]:
        """``/predict``: ``enter`` with ``answer``."""
        return self.enter(head, read, self.answer)

    def answer(self, params: Params, head: Head) -> Answered[Output]:
        """The answer, from the inference cache when it has it. ``head.caller``'s cache
        entries are its own unless SERVING_CACHE_PER_KEY is off. With a follow-up queue
        (the time-lag pattern), the same request is queued for the slow handler too, as
        the caller's job (a repeat, such as a cache hit, shares the first one's job).
        With SERVING_PAYLOAD_LOG_URL, the exchange is offered to the payload log: its
        answer, or the ``ServingError`` it ended in."""
        payloads = self.service.payloads
        if payloads is None:
            return self._answer(params, head)
        try:
            answered = self._answer(params, head)
        except ServingError as error:
            payloads.offer(head.request_id, params, error=error)
            raise
        payloads.offer(head.request_id, params, answered.output)
        return answered

    def _answer(self, params: Params, head: Head) -> Answered[Output]:
        service = self.service
        cache = service.cache
        batch_size: int | None = None

        def compute(alone: Callable[[], bool] = lambda: True) -> Output:
            nonlocal batch_size
            computed = service.compute(
                params,
                request_id=head.request_id,
                arrival=head.arrival,
                timeout_s=head.timeout_s,
                client=head.client,
                alone=alone,
            )
            batch_size = computed.batch_size
            output: Output = computed.output  # Service.compute's: the finished answer
            return output

        output: Output
        if cache is not None:
            # A hit answers what a miss would: parameters the schema refuses get
            # the same 400, whatever an entry (another build's, a batch's) holds.
            service.engine.validate(params)
        entries_of = (head.caller or None) if self._cache_per_key else None
        if cache is not None and (key := cache.key_for(params, entries_of)) is not None:
            # A request waiting for an identical one in flight waits no longer
            # than its own deadline.
            wait_s = service.deadline(head.arrival, head.timeout_s) - time.monotonic()
            try:
                output, served = cache.single_flight(
                    key,
                    lambda: compute(alone=lambda: not cache.followed(key)),
                    timeout_s=max(0.0, wait_s),
                )
            except TimeoutError:
                raise DeadlineExceeded(
                    "no answer within the deadline (an identical request in flight had none "
                    "yet); retry later or ask for a longer timeout"
                ) from None
        else:
            output, served = compute(), None
        output = service.jobs.follow_up(output, params, head.request_id, head.caller)
        return Answered(output, served, batch_size)

    def stream(self, head: Head, read: Callable[[], Params]) -> Streamed:
        """A generating handler's chunks as they come: ``enter`` with ``open_stream``."""
        return self.enter(head, read, self.open_stream)

    def open_stream(self, params: Params, head: Head) -> Streamed:
        """The answer step of a stream: no cache (a stream is computed as it is sent), its
        first event already in, so an error before any chunk is raised here."""
        return self.service.stream(
            params,
            request_id=head.request_id,
            arrival=head.arrival,
            timeout_s=head.timeout_s,
            client=head.client,
        )

    def cache_header(self, answered: Answered[Any]) -> CacheResult | None:
        """What the front may tell the client of how the cache served it (``X-Cache``):
        nothing unless SERVING_CACHE_HEADER, for a hit says someone sent the same."""
        return answered.served if self._cache_header else None
