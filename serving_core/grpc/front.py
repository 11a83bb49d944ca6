"""One worker's gRPC server: the V2 service, grpc.health.v1 and reflection, on
SERVING_GRPC_PORT with SO_REUSEPORT, so that every worker listens on the same
port and the kernel spreads connections over them, as gunicorn's socket does
for HTTP (the master holds the port first: ``process.grpcport``). Started once
the worker's service is (``process.hooks.Hooks.post_worker_init``), so a call
lands on this worker's batcher, beside its HTTP requests.

grpcio serves each call on a native thread of its pool. What touches the
service runs through the worker's ``Runtime.enter``: as it is on a gthread
worker, and as a greenlet on the hub of a gevent worker (``hubcalls``), where
the worker's HTTP requests run, so both fronts' rows share one queue and one
batch. The pool holds ``budget.pool_size`` threads: SERVING_THREADS inference
calls, and budgets of their own for long-lived streams and probes (``budget``);
below those, admission refuses (a full SERVING_MAX_QUEUE) before a call waits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from serving_core.grpc.budget import CallBudgets, pool_size
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
        *,
        described: bool = True,
        open_description: bool = False,
    ) -> None:
        """``allows``: whether a presented API key is one; ``identify``: a key's caller
        identity (both None: no keys are set). ``described``: metadata and reflection
        are served (not with SERVING_PRIVATE_ENDPOINTS and no keys, as /metadata);
        ``open_description``: they need no key (SERVING_PUBLIC_METADATA)."""
        host = settings.bind.rpartition(":")[0]
        self.address = f"{host}:{settings.grpc_port}"
        threads = pool_size(settings.threads)
        interceptors: list[Any] = [CallBudgets(settings.threads)]
        if allows is not None:
            interceptors.insert(0, KeyCheck(allows, open_description=open_description))
        self.server = grpc.server(
            futures.ThreadPoolExecutor(threads, thread_name_prefix="grpc"),
            maximum_concurrent_rpcs=threads,
            interceptors=interceptors,
            options=[
                ("grpc.so_reuseport", 1),
                # As SERVING_MAX_BODY_BYTES for HTTP: a larger message is refused unread.
                ("grpc.max_receive_message_length", settings.max_body_bytes),
                ("grpc.max_send_message_length", -1),
            ],
        )
        add_servicer = pb_grpc.add_GRPCInferenceServiceServicer_to_server
        door = FrontDoor(service)
        servicer = InferenceServicer(
            Model(door), door, metrics, identify, enter=service.runtime.enter, described=described
        )
        add_servicer(servicer, self.server)  # type: ignore[no-untyped-call]
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        if described:
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
        stopped = self.server.stop(grace_s)
        # Waited for in short sleeps, not on the event: on a gevent worker ``time.sleep``
        # yields to the hub, which runs the greenlets of the calls in hand.
        deadline = time.monotonic() + grace_s + 1.0
        while not stopped.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)

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
