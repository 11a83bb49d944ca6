"""gRPC's ``ModelInfer`` takes the caller from the call's API key, as HTTP does from the
request's: with SERVING_CACHE_PER_KEY (the default), one key's cache entries never
answer another key's call (``grpc.servicer``, over a real ``FrontDoor`` and cache)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flask import Flask

from serving_core.online.door import FrontDoor
from tests.conftest import make_app
from tests.v2.grpc_call import Call

pb = pytest.importorskip("serving_core.grpc.proto.grpc_predict_v2_pb2")

HANDLER = str(Path(__file__).parent / "tensors_handler.py")


@pytest.fixture
def app() -> Iterator[Flask]:
    app = make_app(HANDLER, max_wait_ms=1, max_batch_size=2)
    service = app.extensions["serving_core"]
    service.start()
    yield app
    service.stop()


def served_from_cache(servicer: Any, key: str) -> bool:
    """Whether the call with ``key`` was answered from the cache (no model call)."""
    request = pb.ModelInferRequest(model_name="scaler")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(np.asarray([1, 2, 3], dtype="<f4").tobytes())
    # The whole call (its caller taken from the key), observing the batch size its door
    # work came back with.
    sizes: list[int | None] = []
    infer = servicer._infer

    def observed(*args: Any) -> Any:
        reply, batch_size = infer(*args)
        sizes.append(batch_size)
        return reply, batch_size

    servicer._infer = observed
    servicer.ModelInfer(request, Call(key))
    return sizes == [None]


def test_a_keys_cache_entries_answer_its_own_calls_and_no_other_keys(app):
    from serving_core.grpc.servicer import InferenceServicer
    from serving_core.v2.model import Model

    door = FrontDoor(app.extensions["serving_core"])
    servicer = InferenceServicer(Model(door), door, identify=lambda key: f"id-{key}")
    assert not served_from_cache(servicer, "alice")
    assert served_from_cache(servicer, "alice")
    assert not served_from_cache(servicer, "bob")


def test_without_keys_every_call_shares_the_cache(app):
    from serving_core.grpc.servicer import InferenceServicer
    from serving_core.v2.model import Model

    door = FrontDoor(app.extensions["serving_core"])
    servicer = InferenceServicer(Model(door), door)
    assert not served_from_cache(servicer, "alice")
    assert served_from_cache(servicer, "bob")
