"""End to end: a worker whose model hangs, exits, dies or leaks is replaced, and only its
own requests fail. Real gunicorn servers under concurrent load (tests/handlers/unruly)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass

import pytest
import requests

from tests.conftest import HANDLERS
from tests.load import ClientThreads
from tests.servers import gunicorn_server

pytestmark = pytest.mark.e2e

UNRULY = str(HANDLERS / "unruly" / "handler.py")
RECONNECT_EVERY = 20


@dataclass
class Sent:
    request_id: str
    client: int
    started: float
    ended: float
    status: int | None  # None: no HTTP answer (the connection failed)
    pid: int | None  # the worker that answered 200
    before_pid: int | None  # the worker that answered the previous 200 on this connection


class Load(ClientThreads[Sent]):
    """``clients`` threads, each on one keep-alive session, sending distinct requests
    back to back until ``stop``."""

    def _client(self, n: int) -> None:
        session = requests.Session()
        last_pid = None  # the worker at the other end of the session's open connection
        for i in range(1_000_000):
            if self._stop.is_set():
                break
            if i % RECONNECT_EVERY == 0:
                # A new connection now and then, as a proxy's pool opens them: a
                # keep-alive connection stays with its worker, so without new ones a
                # replacement worker would never get any traffic.
                session.close()
                session = requests.Session()
                last_pid = None
            request_id = f"c{n}-{i}"
            started = time.monotonic()
            status = pid = None
            try:
                response = session.post(
                    self.url + "/predict",
                    json={"text": request_id},
                    headers={"X-Request-ID": request_id},
                    timeout=30,
                )
                status = response.status_code
                if status == 200:
                    pid = response.json()["pid"]
            except requests.RequestException:
                pass
            with self._lock:
                self.sent.append(
                    Sent(request_id, n, started, time.monotonic(), status, pid, last_pid)
                )
            kept = status is not None and response.headers.get("Connection") != "close"
            last_pid = (pid or last_pid) if kept else None
        session.close()

    def answered_by(self) -> set[int]:
        with self._lock:
            return {s.pid for s in self.sent if s.pid is not None}

    def wait(self, condition, what: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout_s} s: {what}")
            time.sleep(0.02)

    def ok_since(self, since: float) -> int:
        with self._lock:
            return sum(s.status == 200 for s in self.sent if s.started >= since)

    def failures(self) -> list[Sent]:
        with self._lock:
            return [s for s in self.sent if s.status != 200]


def ready_pids(log: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"worker (\d+) ready", log)]


def wait_for_new_worker(server, known: set[int], timeout_s: float = 60.0) -> tuple[int, float]:
    """The next worker to log that it is ready, and when the test saw it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.process.poll() is None, f"the master exited:\n{server.output()}"
        new = [pid for pid in ready_pids(server.output()) if pid not in known]
        if new:
            return new[0], time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"no new worker within {timeout_s} s:\n{server.output()}")


def access_lines(log: str) -> dict[str, dict]:
    """JSON access lines by request id: who answered each request, and how."""
    lines = {}
    for line in log.splitlines():
        if line.startswith("{") and '"request_id"' in line and '"status"' in line:
            entry = json.loads(line)
            lines[entry["request_id"]] = entry
    return lines


def queue_depth(url: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return float(re.search(r"^serving_queue_depth (\S+)$", text, re.M).group(1))


@pytest.mark.parametrize("trigger", ["hang", "exit"])
def test_a_hung_or_exiting_model_gets_its_worker_replaced_and_fails_only_its_requests(trigger):
    timeout_s = 2.0
    env = {
        "SERVING_HANDLER": UNRULY,
        "SERVING_WORKERS": "2",
        "SERVING_REQUEST_TIMEOUT_S": str(timeout_s),
        "SERVING_CACHE_SIZE": "0",
        "SERVING_LOG_FORMAT": "json",
    }
    with gunicorn_server(env) as server, Load(server.url, 32) as load:
        first = set(ready_pids(server.output()))
        load.wait(lambda: load.answered_by() == first, "both workers answer")
        sent_at = time.monotonic()
        trigger_thread = threading.Thread(
            target=requests.post,
            args=(server.url + "/predict",),
            kwargs={"json": {trigger: True}, "headers": {"X-Request-ID": "trigger"}, "timeout": 30},
        )
        trigger_thread.start()
        new, ready_at = wait_for_new_worker(server, first)
        (culprit,) = (
            int(p) for p in re.findall(rf"unruly {trigger}s in pid (\d+)", server.output())
        )
        load.wait(lambda: new in load.answered_by(), "the new worker answers")
        load.wait(lambda: load.ok_since(ready_at) >= 200, "200 answers after the new worker")
        load.stop()
        trigger_thread.join(30)
        assert queue_depth(server.url) == 0
        log = server.output()

    assert ready_at - sent_at < timeout_s + 5, f"replaced after {ready_at - sent_at:.1f} s"
    if trigger == "hang":
        assert f"worker {culprit}: a batch of" in log
        assert re.search(r"past its deadline \(request ids: [^)]*\btrigger\b", log)
    else:
        assert "the handler raised SystemExit" in log
    answered = access_lines(log)
    assert answered["trigger"]["pid"] == culprit
    failed = load.failures()
    for sent in failed:
        # Each failure was the culprit's: answered by it, or cut when it left.
        if sent.status is not None:
            assert answered[sent.request_id]["pid"] == culprit, sent
        else:
            assert sent.before_pid in (culprit, None), sent
        assert sent.started < ready_at, sent
    assert sum(s.status == 200 for s in load.sent) > 400
    print(
        f"{trigger}: new worker ready {ready_at - sent_at:.2f} s after the trigger; "
        f"{len(failed)} of {len(load.sent)} requests failed"
    )


def test_kill_9_of_a_worker_fails_only_its_requests_and_a_respawn_survives_a_failed_warm_up(
    tmp_path,
):
    flag = tmp_path / "fail-warm-up"
    env = {
        "SERVING_HANDLER": UNRULY,
        "SERVING_WORKERS": "2",
        # One worker can hold all 64 clients while the other is replaced.
        "SERVING_MAX_QUEUE": "64",
        "SERVING_CACHE_SIZE": "0",
        "UNRULY_FAIL_WARMUP": str(flag),
    }
    with gunicorn_server(env) as server, Load(server.url, 64) as load:
        workers = set(ready_pids(server.output()))
        load.wait(lambda: load.answered_by() == workers, "both workers answer")
        killed = min(workers)
        killed_at = time.monotonic()
        os.kill(killed, signal.SIGKILL)
        new, ready_at = wait_for_new_worker(server, workers)
        ready_s = ready_at - killed_at
        load.wait(lambda: new in load.answered_by(), "the new worker answers")

        # The next replacement's warm-up fails once: it exits alone, the master
        # stays up and forks another.
        flag.write_text("")
        workers.add(new)
        os.kill(new, signal.SIGKILL)
        again, _ = wait_for_new_worker(server, workers)
        assert not flag.exists()
        load.wait(lambda: again in load.answered_by(), "the third worker answers")
        since = time.monotonic()
        load.wait(lambda: load.ok_since(since) >= 200, "200 answers after the third worker")
        load.stop()
        assert server.process.poll() is None
        log = server.output()

    assert ready_s < 2.0, f"a new worker was ready {ready_s:.2f} s after kill -9"
    assert "the warm-up failed once, as asked" in log
    assert "it exits in 1 s and gunicorn forks another" in log
    assert "Worker failed to boot" not in log
    failed = load.failures()
    # Only the killed workers' requests failed: cut connections, no error answers.
    assert all(s.status is None for s in failed), failed
    assert all(s.before_pid in (killed, new, None) for s in failed), failed
    assert len(failed) <= 2 * 64
    print(
        f"kill -9: a new worker was ready {ready_s:.2f} s later; "
        f"{len(failed)} of {len(load.sent)} requests failed"
    )


@pytest.mark.parametrize(
    "recycling",
    [
        {"SERVING_MAX_REQUESTS": "60"},  # jitter: 0..6
        {"SERVING_MAX_RSS_BYTES": str(400 * 2**20)},
    ],
    ids=["max_requests", "max_rss_bytes"],
)
def test_a_leaking_handler_is_recycled_with_no_failed_requests(tmp_path, recycling):
    env = {
        "SERVING_HANDLER": UNRULY,
        "SERVING_WORKERS": "1",
        "SERVING_CACHE_SIZE": "0",
        "SERVING_METRICS_DIR": str(tmp_path),
        **recycling,
    }
    with gunicorn_server(env) as server:
        seen: list[int] = []
        ok = 0
        with requests.Session() as session:
            for i in range(2000):
                response = session.post(
                    server.url + "/predict", json={"text": str(i), "leak_mb": 8}, timeout=60
                )
                assert response.status_code == 200, response.text
                ok += 1
                pid = response.json()["pid"]
                if not seen or seen[-1] != pid:
                    seen.append(pid)
                if len(seen) == 3:  # recycled twice
                    break
        log = server.output()
        leftovers = sorted(p.name for p in tmp_path.glob("*.db"))
    assert len(seen) == 3, f"{ok} requests, workers {seen}"
    if "SERVING_MAX_RSS_BYTES" in recycling:
        assert "passed SERVING_MAX_RSS_BYTES" in log
    else:
        assert "Autorestarting worker after current request" in log
    # The replaced workers' metric files were folded into the archive.
    assert not [name for name in leftovers if any(f"_{pid}.db" in name for pid in seen[:2])]
