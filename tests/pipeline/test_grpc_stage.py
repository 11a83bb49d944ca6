"""A pipeline's gRPC stage against a scripted V2 gRPC server (grpcio's own, in this
process): int64 tensors typed by the model's metadata, the key as metadata, the
deadline, a retry on UNAVAILABLE, and the pipeline's error for each failure."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from serving_core.errors import BadGateway, InvalidParams
from serving_core.grpc.keys import presented
from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb
from serving_core.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from serving_core.grpc.stage import CHANNELS, GrpcStages
from serving_core.pipeline import pipeline, transport
from serving_core.pipeline.config import PipelineError
from serving_core.runtime import Runtime
from tests.servers import free_port


class Scripted(pb_grpc.GRPCInferenceServiceServicer):
    """A model taking input_ids (INT64); each ModelInfer does the next scripted step:
    ``ok`` (answers the ids' sum as FP32), a status code to abort with, or ``hang``."""

    def __init__(self) -> None:
        self.script: list[Any] = []
        self.calls: list[tuple[dict[str, str], Any]] = []
        self.peers: list[str] = []  # each call's client address: its connection
        self.release = threading.Event()

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        answer = pb.ModelMetadataResponse(name=request.name, versions=["1"], platform="x")
        answer.inputs.add(name="input_ids", datatype="INT64", shape=[-1, -1])
        return answer

    def ModelInfer(self, request: Any, context: Any) -> Any:
        self.calls.append((dict(context.invocation_metadata()), request))
        self.peers.append(context.peer())
        step = self.script.pop(0) if self.script else "ok"
        if step == "hang":
            self.release.wait(30)
            context.abort(grpc.StatusCode.CANCELLED, "released")
        if isinstance(step, grpc.StatusCode):
            context.abort(step, f"scripted {step.name}")
        ids = np.frombuffer(request.raw_input_contents[0], dtype="<i8")
        reply = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
        reply.outputs.add(name="total", datatype="FP32", shape=[1, 1])
        reply.raw_output_contents.append(np.array([ids.sum()], dtype="<f4").tobytes())
        return reply


@pytest.fixture(autouse=True)
def grpc_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    # As the command line does before it loads a handler (commands.startup).
    monkeypatch.setattr(transport, "_grpc", GrpcStages)


@pytest.fixture(scope="module")
def stage() -> Iterator[tuple[Scripted, str]]:
    servicer = Scripted()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.release.set()
    server.stop(grace=None)


def grpc_pipeline(tmp_path: Path, target: str, **stage: Any) -> pipeline.Pipeline:
    spec = {
        "kind": "serial",
        "stages": [{"name": "ids", "grpc_env": "IDS_GRPC", "model": "ids", **stage}],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(spec))
    one = pipeline.load(path, {"IDS_GRPC": target, "IDS_KEY": "key-42"})
    one.setup_worker()
    return one


def test_a_grpc_stage_sends_int64_tensors_with_the_key_and_retries_unavailable(stage, tmp_path):
    servicer, target = stage
    servicer.calls.clear()
    servicer.script[:] = [grpc.StatusCode.UNAVAILABLE]
    one = grpc_pipeline(tmp_path, target, key_env="IDS_KEY", retries=1)
    answer = one.predict({"input_ids": [101, 7592, 102], "text": "stays behind"})
    assert answer["total"] == [7795.0]
    assert answer["stages"][0]["attempts"] == 2
    (metadata, request), _ = servicer.calls
    assert presented(list(metadata.items())) == "key-42"  # as the gRPC front reads keys
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("input_ids", "INT64", [1, 3])
    ]


def test_a_grpc_stages_calls_take_its_connections_in_turn(stage, tmp_path):
    # The target's workers share its port (SO_REUSEPORT spreads connections, not
    # calls): the calls of one worker of this pipeline go over CHANNELS connections.
    servicer, target = stage
    servicer.peers.clear()
    one = grpc_pipeline(tmp_path, target)
    for _ in range(2 * CHANNELS):
        assert one.predict({"input_ids": [1, 2]})["total"] == [3.0]
    assert len(set(servicer.peers)) == CHANNELS
    assert servicer.peers[:CHANNELS] == servicer.peers[CHANNELS:]  # in turn


def test_a_grpc_stage_out_of_retries_is_a_502_without_its_address(stage, tmp_path):
    servicer, target = stage
    servicer.script[:] = [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    with pytest.raises(BadGateway, match="stage 'ids' failed: gRPC RESOURCE_EXHAUSTED"):
        grpc_pipeline(tmp_path, target, retries=1).predict({"input_ids": [1]})
    assert servicer.script == []  # both sent: the first refusal was retried
    down = grpc_pipeline(tmp_path, f"127.0.0.1:{free_port()}", retries=0)
    with pytest.raises(BadGateway) as refused:
        down.predict({"input_ids": [1]})
    assert "UNAVAILABLE" in refused.value.message
    assert "127.0.0.1" not in str(refused.value.message)


def test_a_grpc_stages_invalid_argument_is_the_pipelines_400(stage, tmp_path):
    servicer, target = stage
    servicer.script[:] = [grpc.StatusCode.INVALID_ARGUMENT]
    with pytest.raises(InvalidParams, match="gRPC INVALID_ARGUMENT: scripted"):
        grpc_pipeline(tmp_path, target).predict({"input_ids": [1]})


def test_a_grpc_stage_that_does_not_answer_in_its_timeout_is_cut_off(stage, tmp_path):
    servicer, target = stage
    servicer.script[:] = ["hang"]
    one = grpc_pipeline(tmp_path, target, timeout_s=0.3, optional=True, retries=3)
    try:
        with pytest.raises(BadGateway) as caught:
            one.predict({"input_ids": [1]})
    finally:
        servicer.release.set()
    (report,) = caught.value.details["stages"]
    # A deadline is not retried: the model may be running the call.
    assert report["reason"] == {"type": "timeout", "message": "no answer within 0.300 s"}
    assert "attempts" not in report


def test_a_field_the_model_takes_missing_from_the_request_is_a_502_naming_it(stage, tmp_path):
    _, target = stage
    with pytest.raises(BadGateway, match="no field 'input_ids'"):
        grpc_pipeline(tmp_path, target).predict({"text": "no ids"})


def test_a_pipeline_with_a_grpc_stage_refuses_the_gevent_worker(tmp_path):
    path = tmp_path / "pipeline.yaml"
    stage = {"name": "ids", "grpc_env": "IDS_GRPC", "model": "ids"}
    path.write_text(yaml.safe_dump({"kind": "serial", "stages": [stage]}))
    with pytest.raises(PipelineError, match="SERVING_WORKER_CLASS=gthread"):
        pipeline.load(path, {"IDS_GRPC": "127.0.0.1:1"}, Runtime("gevent"))


def test_a_grpc_stage_with_no_transport_provided_is_refused_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transport, "_grpc", None)
    with pytest.raises(PipelineError, match="provide_grpc"):
        grpc_pipeline(tmp_path, "127.0.0.1:1")
