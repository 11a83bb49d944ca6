"""A pipeline's added latency over calling one stage directly, p50 and p99, at c=1 and c=32.

Serves the iris classifiers with ``serving-core serve`` (one worker each) and
drives each target with ``wrk`` (``bench/pipeline.lua``: keep-alive
connections, closed loop, one iris row):

- direct: ``handlers/iris-setosa`` itself;
- serial-1: a one-stage serial pipeline over that same service (one worker):
  the pipeline's own cost, one hop more;
- parallel-3: ``handlers/iris-pipeline`` over the three classifiers (best_label).

The added latency is the pipeline's p50 (p99) minus direct's at the same
concurrency. Everything shares the machine's cores, as stages sharing a node do.

    .venv/bin/python bench/pipeline.py [--seconds 10] [--concurrency 1 32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.servers import gunicorn_server  # noqa: E402

LUA = ROOT / "bench" / "pipeline.lua"
SPECIES = ("setosa", "versicolor", "virginica")
# One worker each; the pipelines may hold every connection of the c=32 run in flight.
STAGE = {"SERVING_WORKERS": "1"}
PIPELINE = {"SERVING_WORKERS": "1", "SERVING_MAX_QUEUE": "64"}


def wrk(url: str, connections: int, seconds: float) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install wrk")
    command = ["wrk", f"-t{min(2, connections)}", f"-c{connections}", f"-d{round(seconds)}s"]
    command += ["--timeout", "30s", "-s", str(LUA), url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    match = re.search(r"^WRK_JSON (.*)$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    result: dict[str, Any] = json.loads(match.group(1))
    result["per_s"] = result["statuses"].get("200", 0) / result["duration_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        stages = {
            species: stack.enter_context(
                gunicorn_server({"SERVING_HANDLER": f"handlers/iris-{species}", **STAGE})
            )
            for species in SPECIES
        }
        urls = {f"IRIS_{s.upper()}_URL": stages[s].url for s in SPECIES}
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (folder / "pipeline.yaml").write_text(
            "kind: serial\nstages:\n  - {name: setosa, url_env: IRIS_SETOSA_URL}\n"
        )
        targets = {
            "direct": stages["setosa"].url,
            "serial-1": stack.enter_context(
                gunicorn_server({"SERVING_HANDLER": str(folder), **PIPELINE, **urls})
            ).url,
            "parallel-3": stack.enter_context(
                gunicorn_server({"SERVING_HANDLER": "handlers/iris-pipeline", **PIPELINE, **urls})
            ).url,
        }
        rows = []
        for connections in args.concurrency:
            for url in targets.values():
                wrk(url, connections, 2)  # warm the keep-alive pools
            measured = {name: wrk(url, connections, args.seconds) for name, url in targets.items()}
            base = measured["direct"]
            for name, result in measured.items():
                bad = sum(n for status, n in result["statuses"].items() if status != "200")
                rows.append(
                    (
                        connections,
                        name,
                        result["p50_ms"],
                        result["p99_ms"],
                        result["p50_ms"] - base["p50_ms"],
                        result["p99_ms"] - base["p99_ms"],
                        result["per_s"],
                        bad,
                    )
                )
    print("| c | target | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | non-200 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for c, name, p50, p99, add50, add99, per_s, bad in rows:
        added = "— | —" if name == "direct" else f"{add50:+.2f} | {add99:+.2f}"
        print(f"| {c} | {name} | {p50:.2f} | {p99:.2f} | {added} | {per_s:.0f} | {bad} |")


if __name__ == "__main__":
    main()
