"""PNG charts of the served and overload benchmarks, from the figures they measured.

``served.py`` and ``overload.py`` save their rows as JSON beside the charts
(``bench/figures/``) and call these; rerun a chart without measuring again:

    .venv/bin/python bench/plots.py bench/figures/served.json
    .venv/bin/python bench/plots.py bench/figures/overload.json

Charts: served throughput against concurrency, and overload latency
percentiles (and goodput) against offered load, one line per batch policy,
with the bare model's limit (bench/bare_model.py) drawn as a line.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, in CI or over ssh
import matplotlib.pyplot as plt

FIGURES = Path(__file__).resolve().parent / "figures"
LIMIT_STYLE: dict[str, Any] = {"color": "grey", "linestyle": "--", "linewidth": 1}


def save_rows(kind: str, rows: list[dict[str, Any]], folder: Path = FIGURES) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.json"
    path.write_text(json.dumps({"kind": kind, "rows": rows}, indent=1) + "\n")
    return path


def _median(rows: Iterable[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in rows)


def _policies(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(str(r["policy"]) for r in rows))


def served(rows: list[dict[str, Any]], folder: Path = FIGURES) -> list[Path]:
    """Answered requests/s and latency against wrk's concurrency, medians over rounds."""
    fig, (throughput, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    levels = sorted({int(r["concurrency"]) for r in rows})
    for number, policy in enumerate(_policies(rows)):
        color = f"C{number}"  # one colour per policy in both panels
        mine = [r for r in rows if r["policy"] == policy]
        at = {c: [r for r in mine if r["concurrency"] == c] for c in levels}
        shown = [c for c in levels if at[c]]
        throughput.plot(
            shown, [_median(at[c], "ok_per_s") for c in shown], "o-", color=color, label=policy
        )
        for key, style in (("p50_ms", "o-"), ("p99_ms", "s:")):
            latency.plot(
                shown,
                [_median(at[c], key) for c in shown],
                style,
                color=color,
                label=f"{policy} {key.removesuffix('_ms')}",
            )
    throughput.axhline(_median(rows, "limit"), label="bare model limit", **LIMIT_STYLE)
    throughput.set(xlabel="concurrent connections (wrk)", ylabel="answered requests/s", ylim=0)
    throughput.set_title("Throughput against concurrency")
    latency.set(xlabel="concurrent connections (wrk)", ylabel="latency (ms)", ylim=0)
    latency.set_title("Latency against concurrency")
    for axes in (throughput, latency):
        axes.set_xscale("log", base=2)
        axes.set_xticks(levels, [str(c) for c in levels])
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    return [_save(fig, folder / "served-throughput.png")]


def overload(rows: list[dict[str, Any]], folder: Path = FIGURES) -> list[Path]:
    """Open loop: answered latency percentiles and goodput against the offered rate."""
    fig, (latency, goodput) = plt.subplots(1, 2, figsize=(11, 4.2))
    for number, policy in enumerate(_policies(rows)):
        color = f"C{number}"
        mine = [r for r in rows if r["policy"] == policy]
        at = {t: [r for r in mine if r["times"] == t] for t in {float(r["times"]) for r in mine}}
        # Along the x axis: the capacity behind each multiple is measured anew each time.
        times = sorted(at, key=lambda t: _median(at[t], "rate"))
        offered = [_median(at[t], "rate") for t in times]
        for key, style in (("ok_p50_ms", "o-"), ("ok_p99_ms", "s:")):
            latency.plot(
                offered,
                [_median(at[t], key) for t in times],
                style,
                color=color,
                label=f"{policy} {key.removeprefix('ok_').removesuffix('_ms')}",
            )
        goodput.plot(
            offered, [_median(at[t], "ok_per_s") for t in times], "o-", color=color, label=policy
        )
    limit = _median(rows, "limit")
    latency.axvline(limit, label="bare model limit", **LIMIT_STYLE)
    goodput.axhline(limit, label="bare model limit", **LIMIT_STYLE)
    latency.set(xlabel="offered requests/s (open loop)", ylabel="answered latency (ms)", ylim=0)
    latency.set_title("Latency percentiles against offered load")
    goodput.set(xlabel="offered requests/s (open loop)", ylabel="answered requests/s", ylim=0)
    goodput.set_title("Goodput against offered load")
    for axes in (latency, goodput):
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    return [_save(fig, folder / "overload-latency.png")]


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


CHARTS = {"served": served, "overload": overload}


def plot_file(path: Path) -> list[Path]:
    """The charts of a JSON file that ``save_rows`` wrote, beside it."""
    saved = json.loads(path.read_text())
    written: list[Path] = CHARTS[saved["kind"]](saved["rows"], path.parent)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="a served.json or overload.json")
    for path in parser.parse_args().files:
        for written in plot_file(path):
            print(f"wrote {written}")


if __name__ == "__main__":
    main()
