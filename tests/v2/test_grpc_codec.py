"""The gRPC codec (serving_core/grpc/codec.py) without a server: which form the
outputs take, read back by KServe's own client code; and the proto's fields."""

from __future__ import annotations

import struct
import subprocess
import sys
from typing import Any

from serving_core.grpc import codec
from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb


def infer_request(*, raw: bool) -> Any:
    message = pb.ModelInferRequest(model_name="scaler")
    values = message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
    label = message.inputs.add(name="LABEL", datatype="BYTES", shape=[1])
    if raw:
        message.raw_input_contents.append(struct.pack("<3f", 1, 2, 3))
        message.raw_input_contents.append(struct.pack("<I", 1) + b"a")
    else:
        values.contents.fp32_contents.extend([1, 2, 3])
        label.contents.bytes_contents.append(b"a")
    return message


# In a process of its own: kserve's copy of the proto and tritonclient's cannot share
# protobuf's default pool (tests/v2/kserve_calls.py).
KSERVE_READS = """
import sys
from kserve.protocol.grpc.grpc_predict_v2_pb2 import ModelInferResponse
from kserve.protocol.infer_type import InferResponse
reply = InferResponse.from_grpc(ModelInferResponse.FromString(sys.stdin.buffer.read()))
print(repr([(o.name, o.data) for o in reply.outputs]))
"""


def test_outputs_after_typed_inputs_are_typed_where_kserves_client_reads_them() -> None:
    """Issue 42, item 6: KServe's InferResponse.from_grpc reads an output's data from
    its typed contents, and got [] when every output came in raw_output_contents."""
    parsed = codec.request(infer_request(raw=False))
    assert parsed.typed
    outputs = [
        ("OUTPUT0", "FP32", parsed.inputs["INPUT0"][1] * 2),
        ("LABEL", "BYTES", parsed.inputs["LABEL"][1]),
    ]
    reply = codec.response("scaler", "3", None, outputs, typed=parsed.typed)
    assert not reply.raw_output_contents
    read = subprocess.run(
        [sys.executable, "-c", KSERVE_READS],
        input=reply.SerializeToString(),
        capture_output=True,
        check=True,
        timeout=120,
    )
    assert read.stdout.decode().strip() == "[('OUTPUT0', [2.0, 4.0, 6.0]), ('LABEL', [b'a'])]"


def test_outputs_after_raw_inputs_are_raw_as_are_all_when_one_has_no_typed_field() -> None:
    parsed = codec.request(infer_request(raw=True))
    assert not parsed.typed  # tritonclient's way: raw in, raw out
    values = parsed.inputs["INPUT0"][1]
    reply = codec.response("scaler", "3", None, [("OUTPUT0", "FP32", values)], typed=False)
    assert reply.raw_output_contents == [struct.pack("<3f", 1, 2, 3)]
    assert not reply.outputs[0].contents.fp32_contents
    # The OIP allows raw or typed in one response, not both: FP16 has no typed field.
    both = [("OUTPUT0", "FP32", values), ("HALF", "FP16", values.astype("<f2"))]
    assert len(codec.response("s", "3", None, both, typed=True).raw_output_contents) == 2


def test_the_protos_inferparameter_has_the_oips_newer_fields() -> None:
    """Issue 42, item 6: the OIP's definition added double_param and uint64_param."""
    assert pb.InferParameter(double_param=0.5).WhichOneof("parameter_choice") == "double_param"
    assert pb.InferParameter(uint64_param=2**64 - 1).uint64_param == 2**64 - 1
