"""How a pipeline reaches its gRPC stages: a transport handed down from above.

The pipeline layer sits below ``grpc`` (grpcio is imported only there, and the gRPC
front serves the online layer, which loads pipelines), so it cannot import the
gRPC client itself without an import cycle. The command line provides it before
any handler loads (``commands.cli``: ``provide_grpc``), as ``process`` hands a
``Runtime`` down; ``serving_core.grpc.stage`` implements it. A pipeline with a
``grpc_env`` stage and no transport provided (a program that builds pipelines
without the CLI) is refused at load, saying how to provide one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from serving_core.pipeline.config import PipelineError


class StageError(Exception):
    """Why a gRPC stage gave no output; ``kind`` is the pipeline's failure kind."""

    def __init__(self, kind: str, message: str, *, retry: bool = False, detail: str = "") -> None:
        super().__init__(message)
        self.kind = kind  # timeout, unavailable, rejected, status, invalid_response
        self.message = message  # for the client: never the stage's address
        self.retry = retry
        self.detail = detail or message  # for the server's log


class GrpcTransport(Protocol):
    """One worker's calls to its gRPC stages (``serving_core.grpc.stage.GrpcStages``)."""

    def infer(
        self,
        target: str,
        model: str,
        params: dict[str, Any],
        *,
        until: float,
        request_id: str,
        api_key: str | None,
        traceparent: str | None = None,
    ) -> dict[str, Any]:
        """``params`` as ``model``'s input tensors at ``target``, sending ``traceparent``
        (the stage call's span) in the metadata; raises ``StageError``."""
        ...

    def ready(self, target: str, model: str, timeout_s: float) -> bool: ...


_grpc: Callable[[], GrpcTransport] | None = None


def provide_grpc(factory: Callable[[], GrpcTransport]) -> None:
    """Let pipelines call gRPC stages, each worker through ``factory()``'s transport."""
    global _grpc  # noqa: PLW0603 - set once, by the command line, before any load
    _grpc = factory


def require_grpc(source: str) -> None:
    """Refuse, at load, a pipeline whose gRPC stages nothing could call."""
    if _grpc is None:
        raise PipelineError(
            f"{source}: a grpc_env stage needs a gRPC transport, and none was provided: "
            "serve it with the serving-core command, or call serving_core.pipeline.transport."
            "provide_grpc(serving_core.grpc.stage.GrpcStages) before loading it"
        )


def grpc_transport() -> GrpcTransport:
    """A new transport for one worker's gRPC stages."""
    if _grpc is None:
        raise PipelineError(
            "this pipeline has a grpc_env stage, but no gRPC transport was provided: run it "
            "with the serving-core command, or call serving_core.pipeline.transport."
            "provide_grpc(serving_core.grpc.stage.GrpcStages) first"
        )
    return _grpc()
