from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from serving_core.context import Context
from serving_core.engine.batcher import Batcher
from serving_core.engine.engine import Engine
from serving_core.engine.policy import make_policy
from serving_core.handler import Handler
from serving_core.metrics.archive import archive_dead_worker
from serving_core.metrics.metrics import FLUSH_S, Metrics
from tests.conftest import PROBE
from tests.servers import ROOT, SERVING_CORE, base_env, gunicorn_server, wait_for_worker_pids


class Echo(Handler):
    def predict(self, params):
        return params


def sample(text, name, **labels):
    """The value of the one sample in a Prometheus exposition with these labels (and
    any others: ``protocol`` on the request metrics), or None."""
    pattern = rf"^{re.escape(name)}(?:\{{(.*)\}})? ([0-9.e+-]+)$"
    found = []
    for match in re.finditer(pattern, text, re.MULTILINE):
        has = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(has.get(k) == str(v) for k, v in labels.items()):
            found.append(float(match.group(2)))
    assert len(found) <= 1, f"{len(found)} samples of {name} with {labels}"
    return found[0] if found else None


def test_the_batcher_and_requests_feed_the_metrics():
    metrics = Metrics()
    metrics.batch(3, 0.02, [0.001, 0.002, 0.003])
    metrics.rejected("queue_full")
    metrics.failed(2)
    metrics.depth(5)
    metrics.request("/predict", 200, 0.01)
    text = metrics.exposition().decode()
    assert sample(text, "serving_batch_size_count") == 1
    assert sample(text, "serving_batch_size_sum") == 3
    assert sample(text, "serving_queue_wait_seconds_count") == 3
    assert sample(text, "serving_rejections_total", reason="queue_full") == 1
    assert sample(text, "serving_rejections_total", reason="predicted_late") == 0
    assert sample(text, "serving_model_errors_total") == 2
    assert sample(text, "serving_queue_depth") == 5
    assert sample(text, "serving_requests_total", route="/predict", status="200") == 1


def metrics_once(url, name, value, timeout_s=5.0):
    """/metrics, read again until sample ``name`` is ``value`` (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = requests.get(url + "/metrics", timeout=10).text
        if sample(text, name) == value or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


def histogram_lines(text, name):
    lines = text.splitlines()
    return sorted(ln for ln in lines if ln.startswith(f"{name}_") and "_created" not in ln)


def test_a_flushed_tally_writes_what_observe_would_have():
    tallied, observed = Metrics(), Metrics()
    # Values on bucket bounds (le is inclusive), between them, and past the last.
    sizes = [1, 2, 3, 16, 17, 256, 300]
    waits = [0.0, 0.001, 0.0011, 0.005, 0.3, 29.9, 45.0]
    for size, wait in zip(sizes, waits, strict=True):
        tallied.batch(size, wait * 2, [wait, wait / 3])
        observed.batch_size.observe(size)
        observed.batch_duration.observe(wait * 2)
        observed.queue_wait.observe(wait)
        observed.queue_wait.observe(wait / 3)
    tallied.flush()
    mine, theirs = tallied.exposition().decode(), observed.exposition().decode()
    for name in (
        "serving_batch_size",
        "serving_batch_duration_seconds",
        "serving_queue_wait_seconds",
    ):
        assert histogram_lines(mine, name) == histogram_lines(theirs, name)
    assert sample(mine, "serving_batch_size_count") == len(sizes)


def test_an_idle_model_thread_writes_its_metrics_within_the_flush_interval(monkeypatch):
    monkeypatch.setattr("serving_core.metrics.metrics.FLUSH_S", 0.2)
    metrics = Metrics()
    batcher = Batcher(
        Engine(Echo(), max_batch_size=4).run,
        policy=make_policy("fixed", max_batch_size=4, max_wait_ms=0),
        max_batch_size=4,
        max_queue=64,
        observer=metrics,
    )
    batcher.start()
    try:
        for round_ in range(3):
            now = time.monotonic()
            pending = [
                batcher.submit({"n": n}, Context(f"r-{n}", now + 5), arrival=now) for n in range(10)
            ]
            for item in pending:
                item.future.result(5)
            # No later batch comes to write them: the idle model thread must. Read
            # from the registry, not /metrics (which flushes this process first).
            deadline = time.monotonic() + 10
            while metrics.registry.get_sample_value("serving_queue_wait_seconds_count") != 10 * (
                round_ + 1
            ):
                assert time.monotonic() < deadline, "not written while idle"
                time.sleep(0.005)
    finally:
        batcher.stop(5)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_under_steady_load_the_tallies_are_written_within_the_flush_interval(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("serving_core.metrics.metrics.time", clock)
    metrics = Metrics()

    def written():
        return metrics.registry.get_sample_value("serving_batch_size_count")

    metrics.batch(4, 0.01, [0.001] * 4)  # the first one goes out at once
    clock.now += FLUSH_S / 2
    metrics.batch(4, 0.01, [0.001] * 4)
    assert written() == 1
    assert metrics.flush_in() == pytest.approx(FLUSH_S / 2)  # what an idle batcher waits
    clock.now += FLUSH_S / 2
    metrics.batch(4, 0.01, [0.001] * 4)
    assert written() == 3
    assert metrics.flush_in() is None


def test_the_app_counts_requests_by_route_and_status(client):
    client.post("/predict", json={"text": "a"})
    client.post("/predict", json={"n": -1})
    client.get("/no/such/path")
    client.get("/predict")  # a 405: counted under its route, not with the 404s
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    text = response.get_data(as_text=True)
    assert sample(text, "serving_requests_total", route="/predict", status="200") == 1
    assert sample(text, "serving_requests_total", route="/predict", status="400") == 1
    assert sample(text, "serving_requests_total", route="unmatched", status="404") == 1
    assert sample(text, "serving_requests_total", route="/predict", status="405") == 1
    assert sample(text, "serving_requests_total", route="unmatched", status="405") is None
    assert sample(text, "serving_batch_size_count") >= 1


@pytest.mark.e2e
def test_metrics_add_up_across_two_workers_and_survive_a_dead_worker(tmp_path):
    env = {
        "SERVING_HANDLER": PROBE,
        "SERVING_WORKERS": "2",
        "SERVING_METRICS_DIR": str(tmp_path),
        # Every request must reach the model for the batch sums to add up.
        "SERVING_CACHE_SIZE": "0",
    }
    (tmp_path / "counter_99999.db").write_bytes(b"stale")  # an earlier run's file
    with gunicorn_server(env) as server:
        wait_for_worker_pids(server.url, 2)
        before = sample(
            requests.get(server.url + "/metrics", timeout=10).text,
            "serving_requests_total",
            route="/predict",
            status="200",
        )
        barrier = threading.Barrier(8)

        def client(n):
            barrier.wait()
            session = requests.Session()
            # Distinct texts: a repeated one would be a cache hit, not a batch item.
            return [
                session.post(
                    server.url + "/predict", json={"text": f"{n}-{i}", "sleep_s": 0.01}, timeout=30
                ).json()["pid"]
                for i in range(10)
            ]

        with ThreadPoolExecutor(8) as pool:
            pids = [pid for batch in pool.map(client, range(8)) for pid in batch]
        assert len(set(pids)) == 2, "both workers must have answered"
        # + each worker's warm-up. The model threads write their histograms within
        # 0.25 s (metrics.FLUSH_S); the worker answering writes its own first.
        text = metrics_once(server.url, "serving_batch_size_sum", 80 + before + 2)
        assert sample(text, "serving_requests_total", route="/predict", status="200") == 80 + before
        assert sample(text, "serving_batch_size_sum") == 80 + before + 2

        assert not (tmp_path / "counter_99999.db").exists()
        assert (tmp_path / f"gauge_livesum_{pids[0]}.db").exists()
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server.output().count(" ready: ") < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        text = metrics_once(server.url, "serving_batch_size_sum", 80 + before + 3)
        # The dead worker's counts stay counted; its live gauge is gone.
        assert sample(text, "serving_requests_total", route="/predict", status="200") == 80 + before
        assert sample(text, "serving_queue_depth") == 0
        assert sample(text, "serving_batch_size_sum") == 80 + before + 3
        assert not (tmp_path / f"gauge_livesum_{pids[0]}.db").exists()
        # Its counters and histograms were folded into the archive, not left behind.
        assert not list(tmp_path.glob(f"*_{pids[0]}.db"))
        assert (tmp_path / "counter_archive.db").exists()
        assert (tmp_path / "histogram_archive.db").exists()


def test_a_dead_workers_counters_and_histograms_fold_into_the_archive(tmp_path):
    def write(path, values):
        mmap = MmapedDict(str(path))
        for key, value in values.items():
            mmap.write_value(key, value, 0.0)
        mmap.close()

    def collect():
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))
        return generate_latest(registry).decode()

    requests_ok = mmap_key("serving_requests", "serving_requests_total", ["s"], ["200"], "h")
    bucket = mmap_key("serving_batch_size", "serving_batch_size_bucket", ["le"], ["1.0"], "h")
    write(tmp_path / "counter_11.db", {requests_ok: 5})
    write(tmp_path / "counter_22.db", {requests_ok: 7})
    write(tmp_path / "histogram_11.db", {bucket: 2})
    write(tmp_path / "counter_archive.db", {requests_ok: 100})
    before = collect()

    archive_dead_worker(tmp_path, 11)
    archive_dead_worker(tmp_path, 99)  # left no files: nothing to do

    assert collect() == before
    assert sample(before, "serving_requests_total", s="200") == 112
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "counter_22.db",
        "counter_archive.db",
        "histogram_archive.db",
    ]


@pytest.mark.example("echo")
def test_an_unusable_metrics_dir_names_the_variable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = subprocess.run(
        [str(SERVING_CORE), "serve"],
        cwd=ROOT,
        env=base_env(
            {
                "SERVING_HANDLER": "handlers/echo/handler.py",
                "SERVING_METRICS_DIR": str(blocker / "sub"),
            }
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "SERVING_METRICS_DIR=" in result.stderr
    assert "writable directory" in result.stderr
