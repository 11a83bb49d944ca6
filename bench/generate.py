"""Streaming generation with continuous batching: the example text generator
(handlers/textgen) served over SSE on /predict, against a bare decode loop of its
own ``step`` at the same batch size.

At each of 1, 4, 8 and 16 concurrent streams (closed loop: each client starts
its next request as its last one ends; client i always sends prompt i, greedy,
``--max-tokens`` tokens), for ``--seconds``:

- the limit: the handler's ``step`` in a loop in this process, no server, the
  streams all prefilled and decoded to the end together, on the core the server
  gets and one torch thread (what the server's one worker has there); measured
  right before and right after the served runs at that concurrency, and the
  served figure divided by the mean of the two;
- served, straight to gunicorn and through nginx: tokens/s received (the SSE
  events that arrived in the window), p50/p99 time to first token (request sent
  to first event) and inter-token latency (between two events of one stream).

One ``serving-core serve``, one worker (every stream in one batch), pinned to
core 0 with the bare loop; the clients (one asyncio loop, raw HTTP/1.1) and
nginx run on the other cores, so that the client's parsing costs the server
nothing.

    .venv/bin/python bench/generate.py [--seconds 10] [--max-tokens 64 256]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from serving_core.context import Context  # noqa: E402
from serving_core.generation import Final, Generation  # noqa: E402
from serving_core.loading import load_handler  # noqa: E402
from tests.nginx_server import nginx_server  # noqa: E402
from tests.servers import gunicorn_server  # noqa: E402

HANDLER = ROOT / "handlers" / "textgen"
CONCURRENCY = [1, 4, 8, 16]
SERVER_CORE = 0
PROMPTS = [
    "And God said",
    "In the beginning",
    "And Abraham",
    "Joseph",
    "And the LORD spake unto Moses",
    "Now the serpent",
    "And Jacob went out",
    "These are the generations",
    "And it came to pass",
    "And Isaac",
    "The sons of Noah",
    "And the waters",
    "And Sarah",
    "Then Pharaoh",
    "And Rachel said",
    "And Laban",
]


@dataclass
class Stream:
    """One client's events: when each request went out and each of its tokens came."""

    sent: list[float] = field(default_factory=list)
    arrivals: list[list[float]] = field(default_factory=list)


def bare(handler: Any, streams: int, max_tokens: int, seconds: float) -> float:
    """Tokens/s of ``handler.step`` alone: ``streams`` sequences prefilled and decoded to
    the end together, over and over for ``seconds``."""
    tokens, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        gens = [
            Generation(handler.preprocess({"prompt": p}), Context(f"b{i}"), max_tokens)
            for i, p in enumerate(PROMPTS[:streams])
        ]
        while gens:
            answers = handler.step(gens)
            kept = []
            for g, answer in zip(gens, answers, strict=True):
                g.steps += 1
                if answer is not None:
                    g.tokens += 1
                    tokens += 1
                if not isinstance(answer, Final) and g.tokens < g.max_tokens:
                    kept.append(g)
            gens = kept
    return tokens / (time.perf_counter() - started)


async def one_request(host: str, port: int, body: bytes, stream: Stream) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST /predict HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    stream.sent.append(time.perf_counter())
    writer.write(head.encode() + body)
    arrivals: list[float] = []
    stream.arrivals.append(arrivals)
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"the server answered {status!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # the headers: gunicorn and nginx both send the body chunked
    pending = b""
    while True:
        size = int((await reader.readline()).strip() or b"0", 16)
        if not size:
            break
        pending += (await reader.readexactly(size + 2))[:-2]  # the chunk, less its CRLF
        now = time.perf_counter()
        *frames, pending = pending.split(b"\n\n")
        for frame in frames:
            if frame.startswith(b"id: "):
                arrivals.append(now)
            elif frame.startswith(b"event: error"):
                raise RuntimeError(f"the stream failed: {frame!r}")
    writer.close()


async def drive(url: str, streams: int, max_tokens: int, seconds: float) -> list[Stream]:
    host, port = url.removeprefix("http://").split(":")
    ends_at = time.perf_counter() + seconds

    async def client(i: int) -> Stream:
        stream = Stream()
        body = json.dumps({"prompt": PROMPTS[i], "max_tokens": max_tokens}).encode()
        while time.perf_counter() < ends_at:
            await one_request(host, int(port), body, stream)
        return stream

    return list(await asyncio.gather(*(client(i) for i in range(streams))))


def served(url: str, streams: int, max_tokens: int, seconds: float) -> dict[str, float]:
    started = time.perf_counter()
    result = asyncio.run(drive(url, streams, max_tokens, seconds))
    window = started + seconds
    tokens = sum(t <= window for s in result for one in s.arrivals for t in one)
    pairs = [(sent, one) for s in result for sent, one in zip(s.sent, s.arrivals, strict=True)]
    ttft = [one[0] - sent for sent, one in pairs if one]
    itl = [b - a for s in result for one in s.arrivals for a, b in itertools.pairwise(one)]
    return {
        "tokens_per_s": tokens / seconds,
        "ttft_p50_ms": 1000 * percentile(ttft, 50),
        "ttft_p99_ms": 1000 * percentile(ttft, 99),
        "itl_p50_ms": 1000 * percentile(itl, 50),
        "itl_p99_ms": 1000 * percentile(itl, 99),
    }


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def limit_of(handler: Any, streams: int, max_tokens: int, seconds: float, back: set[int]) -> float:
    """``bare`` on the server's core with one torch thread, as its worker runs."""
    import torch

    os.sched_setaffinity(0, {SERVER_CORE})
    torch.set_num_threads(1)
    try:
        return bare(handler, streams, max_tokens, seconds)
    finally:
        os.sched_setaffinity(0, back)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    # Short answers join and leave the batch four times as often as long ones: each
    # join is a prefill and a copy of the running caches, and each client's turn
    # between two requests leaves its place empty.
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--concurrency", type=int, nargs="+", default=CONCURRENCY)
    args = parser.parse_args()
    cores = os.sched_getaffinity(0)
    others = cores - {SERVER_CORE} or cores
    loaded = load_handler(str(HANDLER / "handler.py"))
    loaded.handler.setup()  # trains the model first where there is none
    handler = loaded.handler
    # The server inherits this process's affinity: one core, so one torch thread.
    os.sched_setaffinity(0, {SERVER_CORE})
    env = {"SERVING_HANDLER": str(HANDLER), "SERVING_WORKERS": "1"}
    env["SERVING_MAX_BATCH_SIZE"] = str(max(args.concurrency))
    with gunicorn_server(env, ready_timeout_s=300) as server:
        os.sched_setaffinity(0, others)
        with nginx_server(server.bind, {"NGINX_WORKER_PROCESSES": "1"}) as proxy:
            served(server.url, 2, args.max_tokens[0], 2)  # warm-up
            for max_tokens in args.max_tokens:
                print(f"max_tokens {max_tokens}, {args.seconds:.0f} s a run, server on core 0")
                print(
                    f"{'streams':>7} {'path':>8} {'limit/s':>8} {'tok/s':>8} {'ratio':>6} "
                    f"{'ttft p50':>8} {'ttft p99':>8} {'itl p50':>8} {'itl p99':>8}  (ms)"
                )
                for streams in args.concurrency:
                    table_rows(
                        handler,
                        server.url,
                        proxied=proxy.url,
                        streams=streams,
                        max_tokens=max_tokens,
                        args=args,
                        others=others,
                    )


def table_rows(
    handler: Any,
    straight: str,
    *,
    proxied: str,
    streams: int,
    max_tokens: int,
    args: argparse.Namespace,
    others: set[int],
) -> None:
    before = limit_of(handler, streams, max_tokens, args.seconds / 2, others)
    rows = {}
    for path, url in (("straight", straight), ("nginx", proxied)):
        rows[path] = served(url, streams, max_tokens, args.seconds)
    after = limit_of(handler, streams, max_tokens, args.seconds / 2, others)
    limit = (before + after) / 2
    for path, row in rows.items():
        print(
            f"{streams:>7} {path:>8} {limit:>8.0f} {row['tokens_per_s']:>8.0f} "
            f"{row['tokens_per_s'] / limit:>6.2f} {row['ttft_p50_ms']:>8.1f} "
            f"{row['ttft_p99_ms']:>8.1f} {row['itl_p50_ms']:>8.2f} "
            f"{row['itl_p99_ms']:>8.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
