"""A closed-loop gRPC load for bench/protocols.py: what wrk is for HTTP, for V2 ModelInfer.

``connections`` channels, each on its own HTTP/2 connection (a local subchannel
pool), as wrk opens one TCP connection per -c (SO_REUSEPORT spreads connections,
not calls, over the workers), each with one call in flight at a time, for
``seconds``. The requests are serialised once, before the clock starts, and the
answers are not parsed: the generator shares this VM's two cores with the
server, so it does as little per call as a C client would. Prints one
``GRPC_JSON {...}`` line in wrk's summary shape (requests, duration_s, p50_ms,
p99_ms, statuses by gRPC code name).

    .venv/bin/python bench/grpc_load.py HOST:PORT MODEL CONNECTIONS SECONDS
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.workload import SENTENCES  # noqa: E402
from serving_core.grpc.proto import grpc_predict_v2_pb2 as pb  # noqa: E402

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def requests_for(model: str) -> list[bytes]:
    out = []
    for sentence in SENTENCES:
        tensor = pb.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[1])
        tensor.contents.bytes_contents.append(sentence.encode())
        out.append(pb.ModelInferRequest(model_name=model, inputs=[tensor]).SerializeToString())
    return out


async def run(target: str, model: str, connections: int, seconds: float) -> dict[str, object]:
    bodies = requests_for(model)
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    # A local subchannel pool each: grpc shares one connection between channels of the
    # same target and arguments by default, and SO_REUSEPORT would then put every call
    # on one worker (32 channels measured 0.62 x /predict that way, on one connection).
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(connections)]
    calls = [channel.unary_unary(METHOD) for channel in channels]  # bytes in, bytes out
    for call in calls:  # connect every channel before the clock starts
        await call(bodies[0], timeout=60)
    start = time.perf_counter()
    end = start + seconds

    async def loop(index: int) -> None:
        call, n = calls[index], index * 7919
        while time.perf_counter() < end:
            n += 1
            sent = time.perf_counter()
            try:
                await call(bodies[n % len(bodies)], timeout=30)
                statuses["OK"] += 1
            except grpc.aio.AioRpcError as error:
                statuses[error.code().name] += 1
            latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(loop(i) for i in range(connections)))
    duration = time.perf_counter() - start
    for channel in channels:
        await channel.close()
    ordered = sorted(latencies)
    return {
        "requests": len(latencies),
        "duration_s": duration,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "statuses": dict(statuses),
    }


def main() -> None:
    target, model, connections, seconds = sys.argv[1:5]
    summary = asyncio.run(run(target, model, int(connections), float(seconds)))
    print("GRPC_JSON " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
