"""``serving-core stream`` with MiniLM over each broker: messages/s against the bare-model
limit, and the end-to-end latency of a paced stream.

For each backend (a real redis-server, a real rabbitmq-server, a Kafka-protocol
broker (Tansu, in memory), as tests/stream runs them), one ``serving-core
stream`` (the default workers and batch size) reads sentences from the broker and
publishes their embeddings back to it:

- **throughput**, in rounds: ``--messages`` sentences produced at once;
  messages/s is that count over the worker's running time, from the first
  produce to the last result published. The limit: the bare model's best cell
  is picked once at the start (``Bare.select``: both layouts at batch 8, 16,
  32); its figures are printed, never the limit (the best of six noisy cells is
  biased upward). Each round measures that cell again interleaved with the run
  (``Bare.measure_cell``): before it, after every ``--slice-s`` of it, with the
  worker's process group stopped (SIGSTOP, the broker holding its messages),
  and after it; the limit is their mean. This VM's speed drifts by 10-20%
  within a minute, which a limit from before and after alone (this bench until
  2026-12-02) missed. The summary is the median of the rounds' ratios to their
  own limit.
- **latency**: an open loop at ``--paced`` times the measured rate for ``--seconds``,
  each message stamped with its send time; the bench polls the results every
  few ms and takes seen - sent, so the p50 includes up to one poll interval.

    .venv/bin/python bench/stream.py [--backends redis amqp kafka] [--messages 3000]
        [--rounds 3] [--paced 0.5] [--seconds 10] [--slice-s 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.bare_model import Bare, Cell, Selection  # noqa: E402
from bench.interleave import run_interleaved  # noqa: E402
from bench.results import Results  # noqa: E402
from bench.workload import SENTENCES  # noqa: E402
from tests.servers import free_port, spawn, stop, wait_for  # noqa: E402
from tests.stream.amqp_broker import AmqpBroker  # noqa: E402
from tests.stream.kafka_broker import KafkaBroker  # noqa: E402
from tests.stream.redis_broker import RedisBroker  # noqa: E402


@contextlib.contextmanager
def kafka_broker() -> Iterator[KafkaBroker]:
    # In memory: over moto's S3 (the tests', for restarts) the S3 server's Python took
    # a core of the two, and the figure was moto's, not the stream worker's.
    with KafkaBroker(None) as broker:
        yield broker


# Each starts its own server, as tests/stream does (the tests share one RabbitMQ node).
BROKERS: dict[str, Any] = {"redis": RedisBroker, "amqp": AmqpBroker, "kafka": kafka_broker}

POLL_S = 0.005  # the latency phase's poll of the results
CELL_S = 3.0  # each bare-model cell's measurement


def messages(prefix: str, count: int, **headers: str) -> list[tuple[str, bytes, dict[str, str]]]:
    return [
        (f"{prefix}-{i}", json.dumps({"text": SENTENCES[i % len(SENTENCES)]}).encode(), headers)
        for i in range(count)
    ]


def cores_used(cpu: list[float], elapsed: float) -> dict[str, float]:
    """Where the cores went over a round (``cpu``: the machine's, the stream worker's
    and this script's CPU seconds): the worker, this script (producing, counting),
    and the rest, which on a quiet machine is the broker, here on the same two cores
    as the worker (in production, on a machine of its own)."""
    busy, worker, own = (seconds / elapsed for seconds in cpu)
    shares = {"worker": worker, "bench": own, "broker": busy - worker - own}
    return {name: round(share, 2) for name, share in shares.items()}


@dataclass
class Worker:
    """A running ``serving-core stream`` over one broker, and how far it got."""

    process: subprocess.Popen[bytes]
    log: Path
    broker: Any
    results: Results
    bare: Bare
    cell: Cell

    def reached(self, n: int) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the stream worker exited:\n{self.log.read_text()[-3000:]}")
        return self.results.count() >= n

    def measure(self) -> float:
        return self.bare.measure_cell(self.cell, CELL_S)

    def throughput(self, round_: int, count: int, slice_s: float) -> dict[str, Any]:
        """Messages/s over the worker's running time, against the mean of the cell's
        measurements before the round, after every ``slice_s`` of it, and after it
        (``interleave.run_interleaved``)."""
        target = 64 + round_ * count
        seen = run_interleaved(
            self.process.pid,
            self.measure,
            lambda: self.reached(target),
            slice_s,
            start=lambda: self.broker.produce(messages(f"r{round_}", count)),
        )
        limits = seen.limits
        rate, limit = count / seen.ran_s, statistics.mean(limits)
        cores = cores_used(seen.cpu, seen.ran_s)
        print(
            f"  round {round_}: {rate:7.1f} msg/s, limit {limit:7.1f}/s (the chosen cell, "
            f"interleaved: {' / '.join(f'{x:.0f}' for x in limits)}), ratio {rate / limit:.2f}; "
            f"cores used: {cores}",
            flush=True,
        )
        return {
            "round": round_,
            "limit": limit,
            "limits": limits,
            "rate": rate,
            "ratio": rate / limit,
            "cores": cores,
        }

    def latency(self, paced: float, seconds: float) -> list[float]:
        """Each paced message's milliseconds from its produce to its result seen."""
        self.results.new_ids()  # skip what the throughput rounds published
        sent: dict[str, float] = {}
        seen: dict[str, float] = {}
        interval, index = 1.0 / paced, 0
        start = time.perf_counter()
        next_at = start
        while time.perf_counter() - start < seconds or len(seen) < len(sent):
            now = time.perf_counter()
            if now >= next_at and now - start < seconds:
                message_id = f"p-{index}"
                sent[message_id] = time.perf_counter()
                text = json.dumps({"text": SENTENCES[index % len(SENTENCES)]}).encode()
                self.broker.produce([(message_id, text, {})])
                index += 1
                next_at += interval
            for message_id in self.results.new_ids():
                if message_id in sent:  # not a throughput round's late (or repeated) result
                    seen.setdefault(message_id, time.perf_counter())
            if now - start > seconds + 60:
                raise RuntimeError(f"{len(sent) - len(seen)} paced messages never came back")
            time.sleep(POLL_S)
        return sorted((seen[k] - sent[k]) * 1000 for k in sent)


def worker_env(broker: Any, folder: Path, handler: str) -> dict[str, str]:
    """``serving-core stream``'s SERVING_ settings for ``handler`` over ``broker`` (a
    ``BROKERS`` entry, entered), its metrics in ``folder`` (also framework_cost.py's)."""
    return {
        "SERVING_HANDLER": handler,
        "SERVING_BIND": f"127.0.0.1:{free_port()}",
        "SERVING_METRICS_DIR": str(folder / "metrics"),
        # The production default claim_idle_ms (a minute), not the tests' 2 s: a
        # consumer stopped for a cell's measurement would have its entries claimed.
        # Kafka's default session timeout too, not the tests' 6 s: a consumer stopped
        # for a cell would have its partitions moved.
        "SERVING_STREAM_SOURCE": re.sub(
            r"&(claim_idle_ms|session\.timeout\.ms|heartbeat\.interval\.ms)=\d+",
            "",
            broker.source_url,
        ),
        "SERVING_STREAM_SINK": broker.sink_url,
        "SERVING_STREAM_DEAD_LETTER": broker.dead_url,
    }


def run_backend(
    backend: str, bare: Bare, selection: Selection, args: argparse.Namespace
) -> dict[str, Any]:
    with BROKERS[backend]() as broker, tempfile.TemporaryDirectory() as tmp:
        env = worker_env(broker, Path(tmp), "handlers/minilm/handler.py")
        log = Path(tmp) / "stream.log"
        results = Results(backend, broker)
        process = spawn("stream", env, log)
        worker = Worker(process, log, broker, results, bare, selection.cell)
        try:
            broker.produce(messages("warm", 64))
            wait_for(lambda: worker.reached(64), lambda: log.read_text()[-3000:], 300)
            print(f"{backend}:", flush=True)
            rounds = [
                worker.throughput(round_, args.messages, args.slice_s)
                for round_ in range(1, args.rounds + 1)
            ]
            paced = args.paced * statistics.median(r["rate"] for r in rounds)
            latencies = worker.latency(paced, args.seconds)
            return {
                "backend": backend,
                "rounds": rounds,
                "paced_per_s": paced,
                "p50_ms": statistics.median(latencies),
                "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
                "paced_messages": len(latencies),
            }
        finally:
            results.close()
            stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["redis", "amqp", "kafka"])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--paced", type=float, default=0.5, help="of the measured rate")
    parser.add_argument("--seconds", type=float, default=10.0, help="of the paced phase")
    parser.add_argument(
        "--slice-s", type=float, default=3.0, help="the worker's run between two measurements"
    )
    args = parser.parse_args()
    summaries = []
    with Bare() as bare:
        selection = bare.select(CELL_S)
        print(selection.describe(), flush=True)
        for backend in args.backends:
            summary = run_backend(backend, bare, selection, args)
            summaries.append({**summary, "selection": selection.to_json()})
    print(f"\n{args.messages} messages a round, medians over {args.rounds} rounds")
    print(
        f"{'backend':>8} {'msg/s':>8} {'limit/s':>8} {'ratio':>6} {'range':>11} "
        f"{'paced/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'broker cores':>12}"
    )
    for s in summaries:
        ratios = [r["ratio"] for r in s["rounds"]]
        print(
            f"{s['backend']:>8} {statistics.median(r['rate'] for r in s['rounds']):>8.1f} "
            f"{statistics.median(r['limit'] for r in s['rounds']):>8.1f} "
            f"{statistics.median(ratios):>6.2f} {min(ratios):>5.2f}-{max(ratios):<5.2f} "
            f"{s['paced_per_s']:>8.1f} {s['p50_ms']:>8.1f} {s['p99_ms']:>8.1f} "
            f"{statistics.median(r['cores']['broker'] for r in s['rounds']):>12.2f}"
        )
    out = ROOT / "bench" / "figures" / "stream.json"
    out.write_text(json.dumps(summaries, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
