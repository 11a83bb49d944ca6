"""KServe's V2 clients, run as a script by tests/v2/test_kserve_client.py.

A process of its own: kserve registers its copy of the V2 proto in protobuf's default
pool, and so does tritonclient, whose tests share the suite's process; two copies of
``inference.*`` in one pool cannot be imported together. Prints one JSON object.

    python tests/v2/kserve_calls.py rest|grpc|bad URL MODEL TEXT...
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc
import kserve


def infer_request(model: str, texts: list[str], request_id: str) -> Any:
    text = kserve.InferInput("text", [len(texts)], "BYTES", data=texts)
    return kserve.InferRequest(model, infer_inputs=[text], request_id=request_id)


def answer(ready: bool, response: Any) -> dict[str, Any]:
    (output,) = [o for o in response.outputs if o.name == "embedding"]
    return {
        "ready": ready,
        "id": response.id,
        "shape": list(output.shape),
        "embedding": output.as_numpy().tolist(),
        # What KServe's own e2e helper (predict_grpc) reads: the typed contents' values,
        # empty when the answer came only as raw bytes.
        "data": len(output.data or []),
    }


async def rest(url: str, model: str, texts: list[str]) -> dict[str, Any]:
    client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", timeout=60))
    try:
        ready = await client.is_model_ready(url, model)
        response = await client.infer(url, infer_request(model, texts, "k-rest"), model)
        return answer(ready, response)
    finally:
        await client.close()


async def grpc_call(target: str, model: str, texts: list[str]) -> dict[str, Any]:
    client = kserve.InferenceGRPCClient(target, timeout=60, retries=0)
    try:
        ready = await client.is_model_ready(model)
        return answer(ready, await client.infer(infer_request(model, texts, "k-grpc")))
    finally:
        await client.close()


async def bad(target: str, model: str) -> dict[str, Any]:
    client = kserve.InferenceGRPCClient(target, timeout=60, retries=0)
    wrong = kserve.InferInput("text", [1], "FP32", data=[1.5])
    try:
        await client.infer(kserve.InferRequest(model, infer_inputs=[wrong]))
    except grpc.aio.AioRpcError as error:
        return {"code": error.code().name, "details": error.details()}
    finally:
        await client.close()
    return {"code": "OK"}


def main() -> None:
    kind, where, model, *texts = sys.argv[1:]
    calls = {
        "rest": lambda: rest(where, model, texts),
        "grpc": lambda: grpc_call(where, model, texts),
    }
    result = asyncio.run(bad(where, model) if kind == "bad" else calls[kind]())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
