"""One worker's gRPC server: the V2 service, grpc.health.v1 and reflection, on
SERVING_GRPC_PORT with SO_REUSEPORT, so that every worker listens on the same
port and the kernel spreads connections over them, as gunicorn's socket does
for HTTP. Started after the worker's service (``process.hooks.Hooks.post_fork``),
so a call lands on this worker's batcher.

Its thread pool is the worker's SERVING_THREADS, and so is the most calls it
holds at once: past that gRPC itself answers ``RESOURCE_EXHAUSTED`` at once,
and below it admission refuses (a full SERVING_MAX_QUEUE) before a call waits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from serving_core.grpc.keys import KeyCheck
from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb
from serving_core.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from serving_core.grpc.servicer import SERVICE, InferenceServicer
from serving_core.metrics.metrics import Metrics
from serving_core.online.door import FrontDoor
from serving_core.online.service import Service
from serving_core.settings import Settings
from serving_core.v2.model import Model

log = logging.getLogger("serving_core.grpc.front")


class GrpcFront:
    def __init__(
        self,
        settings: Settings,
        service: Service,
        metrics: Metrics | None = None,
        allows: Callable[[str | None], bool] | None = None,
        identify: Callable[[str], str] | None = None,
    ) -> None:
        """``allows``: whether a presented API key is one; ``identify``: a key's caller
        identity (both None: no keys are set)."""
        host = settings.bind.rpartition(":")[0]
        self.address = f"{host}:{settings.grpc_port}"
        self.server = grpc.server(
            futures.ThreadPoolExecutor(settings.threads, thread_name_prefix="grpc"),
            maximum_concurrent_rpcs=settings.threads,
            interceptors=[KeyCheck(allows)] if allows is not None else [],
            options=[
                ("grpc.so_reuseport", 1),
                # As SERVING_MAX_BODY_BYTES for HTTP: a larger message is refused unread.
                ("grpc.max_receive_message_length", settings.max_body_bytes),
                ("grpc.max_send_message_length", -1),
            ],
        )
        add_servicer = pb_grpc.add_GRPCInferenceServiceServicer_to_server
        door = FrontDoor(service)
        servicer = InferenceServicer(Model(door), door, metrics, identify)
        add_servicer(servicer, self.server)  # type: ignore[no-untyped-call]
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server, pool=_reflected_pool())
        try:
            self.server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise RuntimeError(
                f"the gRPC front cannot listen on {self.address} ({exc}): free that port or "
                "set SERVING_GRPC_PORT to another"
            ) from exc

    def start(self) -> None:
        self.server.start()
        self._serving(True)
        log.info("gRPC (V2) listening on %s", self.address)

    def drain(self) -> None:
        """SIGTERM: health says NOT_SERVING, as /readyz turns 503; calls are still served."""
        self._serving(False)

    def stop(self, grace_s: float) -> None:
        self._serving(False)
        self.server.stop(grace_s).wait(grace_s + 1.0)

    def _serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE):
            self.health.set(name, status)


def _reflected_pool() -> Any:  # a protobuf DescriptorPool (protobuf ships no types)
    """Our messages' own pool (setup.py's ``private_pool`` says why they are not in the
    default one), with health's and reflection's files added, so that reflection can
    describe every service it lists (``grpcurl describe``)."""
    for module in (health_pb2, reflection_pb2):
        # The same file again (another front in this process) is accepted as it is.
        pb.POOL.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pb.POOL
