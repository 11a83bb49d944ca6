"""The service's one model as V2 sees it: its metadata and readiness, and inference
through the front door's ``answer`` (deadlines, the cache, the batcher), one call
per row of the batch dimension, so the rows batch with every other request.

Flask-free and wire-free: a front (REST in ``web/v2routes``; gRPC) runs a request
through ``FrontDoor.enter`` with ``infer`` as its answer: it decodes an
``InferRequest`` and encodes the ``Answered`` outputs that ``infer`` returns.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import serving_core
from serving_core.errors import BadRequest, DeadlineExceeded, NotFound, quote
from serving_core.handler import Output, Params
from serving_core.online.door import Answered, FrontDoor, Head
from serving_core.online.streamed import Streamed
from serving_core.v2.mapping import OutputNotTensor, TensorMap
from serving_core.v2.request import InferRequest
from serving_core.v2.tensors import Array, check_chars

log = logging.getLogger("serving_core.v2.model")
SERVER = "serving-core"
EXTENSIONS = ("binary_tensor_data",)
# A row waits this long past its deadline for its answer: the service ends it by then.
_MARGIN_S = 5.0


# An answer's output tensors: (name, datatype, array), in the order asked.
Outputs = list[tuple[str, str, Array]]


class Model:
    def __init__(self, door: FrontDoor) -> None:
        self.door = door
        service = door.service
        self._service = service
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
        return self._service.ready

    def infer(self, request: InferRequest, head: Head) -> Answered[Outputs]:
        """The outputs, and how the request was served: the cache's word and the model's
        batch of its first row (each row is its caller's, ``head.caller``, as one
        ``/predict``: whose cache entries and follow-up jobs)."""
        rows = self._rows(request)
        declared = self.tensors.outputs
        if request.outputs is not None and declared is not None:
            self._check_asked(request.outputs, [t.name for t in declared])
        answers, first = self._answer(rows, head)
        try:
            arrays = self.tensors.output_arrays(answers)
        except OutputNotTensor as exc:
            log.error("request %s: %s", head.request_id, exc.message)
            raise
        if request.outputs is not None:
            by_name = {name: (name, datatype, array) for name, datatype, array in arrays}
            self._check_asked(request.outputs, list(by_name))
            arrays = [by_name[name] for name in request.outputs]
        # X-Cache tells how one answer was served: a request of several has none.
        served = first.served if len(rows) == 1 else None
        return Answered(arrays, served, first.batch_size)

    def answer(self, request: InferRequest, head: Head) -> tuple[InferRequest, Answered[Outputs]]:
        """``infer``, with the request it answered: the door's answer step for a front
        that reads the request inside the door (``FrontDoor.enter``) and encodes the
        response after it, with the request's id and the outputs it asked for."""
        return request, self.infer(request, head)

    def open_stream(self, request: InferRequest, head: Head) -> tuple[InferRequest, Streamed]:
        """A generating handler's chunks for a request of one row: the door's answer step
        for a streaming front (gRPC's ``ModelStreamInfer``), its first event in."""
        rows = self._rows(request)
        if len(rows) != 1:
            raise BadRequest(f"a stream answers one row; this request has {len(rows)}")
        return request, self.door.open_stream(rows[0], head)

    def outputs_of(self, request: InferRequest, output: Output) -> Outputs:
        """One answer's (or one chunk's) output tensors, those the request asked for."""
        arrays = self.tensors.output_arrays([output])
        if request.outputs is None:
            return arrays
        by_name = {name: (name, datatype, array) for name, datatype, array in arrays}
        self._check_asked(request.outputs, list(by_name))
        return [by_name[name] for name in request.outputs]

    def _rows(self, request: InferRequest) -> list[Params]:
        settings = self._service.settings
        # Here, for every front: a JSON body's strings are bounded as it is parsed, and
        # binary BYTES (REST's extension, gRPC's raw or typed contents) only here.
        for name, (datatype, array) in request.inputs.items():
            check_chars(name, datatype, array, settings.max_string_chars)
        return self.tensors.rows(request.inputs, settings.max_queue)

    @staticmethod
    def _check_asked(asked: tuple[str, ...], known: list[str]) -> None:
        for name in asked:
            if name not in known:
                raise BadRequest(
                    f"output {quote(name)} is not an output of this model; its outputs: "
                    f"{', '.join(map(repr, known))}"
                )

    def _answer(self, rows: list[Params], head: Head) -> tuple[list[Output], Answered[Output]]:
        """Every row's answer, the rows waiting at once (each where the runtime runs a
        task: a greenlet, or a thread), and the first row's whole; the first row's
        error, in row order, if any."""
        service = self._service
        answer = self.door.answer

        def row(index: int) -> Answered[Output]:
            # Each row its own id (the error lines tell the rows apart), and no client
            # to watch: one watcher a socket, the first row's.
            return answer(
                rows[index],
                dataclasses.replace(head, request_id=f"{head.request_id}.{index}", client=None),
            )

        futures: list[Future[Answered[Output]]] = []
        for index in range(1, len(rows)):
            future: Future[Answered[Output]] = service.runtime.new_future()
            service.runtime.spawn(_settle(future, functools.partial(row, index)))
            futures.append(future)
        # The first row here, watching the client's connection.
        first: BaseException | Answered[Output]
        try:
            first = answer(rows[0], head)
        except Exception as exc:
            first = exc
        wait_s = service.settings.request_timeout_s + _MARGIN_S
        results: list[Any] = [first]
        for future in futures:
            try:
                left = max(0.0, head.arrival + wait_s - time.monotonic())
                results.append(future.result(timeout=left))
            except TimeoutError:
                results.append(DeadlineExceeded("a row of the request had no answer in time"))
            except Exception as exc:
                results.append(exc)
        for index, result in enumerate(results):
            if isinstance(result, BadRequest) and len(results) > 1:
                raise _of_row(result, index, len(results)) from result
            if isinstance(result, BaseException):
                raise result
        return [result.output for result in results], results[0]


def _of_row(error: BadRequest, index: int, count: int) -> BadRequest:
    """``error`` as the client's whole request's: which row of the batch it was."""
    named = copy.copy(error)
    named.message = f"row {index} of {count} (its index in the batch dimension): {error.message}"
    named.args = (named.message,)
    return named


def _settle(future: Future[Any], call: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            future.set_result(call())
        except Exception as exc:
            future.set_exception(exc)

    return run
