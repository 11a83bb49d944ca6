"""The service's one model as V2 sees it: its metadata and readiness, and inference
through ``Service.answer`` (admission, deadlines, the cache, the batcher), one
call per row of the batch dimension, so the rows batch with every other request.

Flask-free and wire-free: a front (REST in ``web/v2routes``; gRPC) decodes an
``InferRequest`` and encodes what ``infer`` returns.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import serving_core
from serving_core.cache.core import CacheResult
from serving_core.errors import BadRequest, DeadlineExceeded, NotFound, quote
from serving_core.handler import Output, Params
from serving_core.online.service import Service
from serving_core.v2.mapping import OutputNotTensor, TensorMap
from serving_core.v2.request import InferRequest
from serving_core.v2.tensors import Array

log = logging.getLogger("serving_core.v2.model")
SERVER = "serving-core"
EXTENSIONS = ("binary_tensor_data",)
# A row waits this long past its deadline for its answer: the service ends it by then.
_MARGIN_S = 5.0


@dataclass(frozen=True)
class InferResponse:
    outputs: list[tuple[str, str, Array]]  # (name, datatype, array), in the order asked
    served: CacheResult | None  # how the cache served a request of one row


class Model:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.name = service.name
        self.version = service.handler.version
        self.tensors = TensorMap(service.handler)

    def find(self, name: str, version: str | None = None) -> None:
        """Raise NotFound unless ``name`` (and ``version``) is this model."""
        if name != self.name:
            raise NotFound(f"no model {quote(name)}; this server serves {self.name!r}")
        if version is not None and version != self.version:
            raise NotFound(
                f"model {self.name!r} has no version {quote(version)}; it serves "
                f"version {self.version!r}"
            )

    @staticmethod
    def server_metadata() -> dict[str, Any]:
        return {
            "name": SERVER,
            "version": serving_core.__version__,
            "extensions": list(EXTENSIONS),
        }

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": SERVER,
            "inputs": self.tensors.metadata_inputs(),
            "outputs": self.tensors.metadata_outputs(),
        }

    @property
    def ready(self) -> bool:
        return self.service.ready

    def infer(
        self,
        request: InferRequest,
        *,
        request_id: str,
        arrival: float,
        timeout_s: float | None = None,
        client: Any = None,
        caller: str = "",
    ) -> InferResponse:
        """``caller``: who asks (as ``Service.answer``'s): whose cache entries and
        follow-up jobs the rows are."""
        rows = self.tensors.rows(request.inputs, self.service.settings.max_queue)
        declared = self.tensors.outputs
        if request.outputs is not None and declared is not None:
            self._check_asked(request.outputs, [t.name for t in declared])
        answers, served = self._answer(
            rows, request_id, arrival, timeout_s, client=client, caller=caller
        )
        try:
            arrays = self.tensors.output_arrays(answers)
        except OutputNotTensor as exc:
            log.error("request %s: %s", request_id, exc.message)
            raise
        if request.outputs is not None:
            by_name = {name: (name, datatype, array) for name, datatype, array in arrays}
            self._check_asked(request.outputs, list(by_name))
            arrays = [by_name[name] for name in request.outputs]
        return InferResponse(arrays, served)

    @staticmethod
    def _check_asked(asked: tuple[str, ...], known: list[str]) -> None:
        for name in asked:
            if name not in known:
                raise BadRequest(
                    f"output {quote(name)} is not an output of this model; its outputs: "
                    f"{', '.join(map(repr, known))}"
                )

    def _answer(
        self,
        rows: list[Params],
        request_id: str,
        arrival: float,
        timeout_s: float | None,
        *,
        client: Any,
        caller: str,
    ) -> tuple[list[Output], CacheResult | None]:
        """Every row's answer, the rows waiting at once (each where the runtime runs a
        task: a greenlet, or a thread); the first row's error, in row order, if any."""
        service = self.service

        def answer(index: int, row_client: Any) -> tuple[Output, CacheResult | None]:
            return service.answer(
                rows[index],
                # Each row its own id: the error lines tell the rows apart.
                request_id=request_id if index == 0 else f"{request_id}.{index}",
                arrival=arrival,
                timeout_s=timeout_s,
                client=row_client,
                caller=caller,
            )

        futures: list[Future[tuple[Output, CacheResult | None]]] = []
        for index in range(1, len(rows)):
            future: Future[tuple[Output, CacheResult | None]] = service.runtime.new_future()
            service.runtime.spawn(_settle(future, functools.partial(answer, index, None)))
            futures.append(future)
        # The first row here, watching the client's connection: one watcher a socket.
        first: BaseException | tuple[Output, CacheResult | None]
        try:
            first = answer(0, client)
        except Exception as exc:
            first = exc
        wait_s = service.settings.request_timeout_s + _MARGIN_S
        results: list[Any] = [first]
        for future in futures:
            try:
                results.append(future.result(timeout=max(0.0, arrival + wait_s - time.monotonic())))
            except TimeoutError:
                results.append(DeadlineExceeded("a row of the request had no answer in time"))
            except Exception as exc:
                results.append(exc)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        # X-Cache tells how one answer was served: a request of several has none.
        return [output for output, _ in results], results[0][1] if len(rows) == 1 else None


def _settle(future: Future[Any], call: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            future.set_result(call())
        except Exception as exc:
            future.set_exception(exc)

    return run
