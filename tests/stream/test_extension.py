"""The broker table is the extension point: a scratch copy of the package gains a
broker with one module (tests/stream/toy.py) and one line in ``BROKERS``, and the
real ``serving-core stream`` then serves it end to end; without the line, start-up
refuses its URLs, naming the scheme and the ones the table has."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.servers import SERVING_CORE, base_env, free_port, spawn, stop, wait_for

# Runs the real serving-core stream: out of make test-fast.
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TABLE = "BROKERS: dict[str, str] = {\n"
LINE = '    "toy": "serving_core.stream.toy",\n'
POLL_TIMEOUT_S = 60.0  # a bound on waiting for an event, never an expected time


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of ``serving_core`` with the toy broker's module and its table line."""
    shutil.copytree(ROOT / "serving_core", tmp_path / "tree" / "serving_core")
    stream = tmp_path / "tree" / "serving_core" / "stream"
    shutil.copy(ROOT / "tests" / "stream" / "toy.py", stream / "toy.py")
    table = stream / "brokers.py"
    text = table.read_text()
    assert TABLE in text, "stream/brokers.py has no BROKERS table to add a line to"
    table.write_text(text.replace(TABLE, TABLE + LINE, 1))
    return tmp_path / "tree"


# The test's own handler: the examples (handlers/echo) may be deleted by a template's owner.
ECHO = """
from serving_core import Handler


class Echo(Handler):
    name = "echo"

    def predict_batch(self, items):
        return [{"echo": item} for item in items]
"""


def env(tree: Path, queues: Path, port: int) -> dict[str, str]:
    handler = queues / "handler.py"
    handler.parent.mkdir(parents=True, exist_ok=True)
    handler.write_text(ECHO)
    return {
        "PYTHONPATH": str(tree),
        "SERVING_HANDLER": str(handler),
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_METRICS_DIR": str(queues / "metrics"),
        "SERVING_STREAM_SOURCE": f"toy://{queues / 'in'}",
        "SERVING_STREAM_SINK": f"toy://{queues / 'out'}",
        "SERVING_STREAM_DEAD_LETTER": f"toy://{queues / 'dead'}",
        "SERVING_WORKERS": "1",
        "SERVING_MAX_BATCH_SIZE": "4",
    }


def produce(directory: Path, messages: dict[str, str]) -> None:
    directory.mkdir(parents=True)
    for message_id, body in messages.items():
        record = {"id": message_id, "body": body, "headers": {"trace": f"t-{message_id}"}}
        (directory / f"{message_id}.json").write_text(json.dumps(record))


def read(directory: Path) -> dict[str, dict[str, Any]]:
    found = {}
    for path in directory.glob("*.json") if directory.exists() else []:
        record = json.loads(path.read_text())
        found[record["id"]] = {"body": json.loads(record["body"]), "headers": record["headers"]}
    return found


def test_a_broker_added_by_one_module_and_one_table_line_serves_end_to_end(
    tree: Path, tmp_path: Path
) -> None:
    queues = tmp_path / "queues"
    produce(queues / "in", {f"m-{i}": json.dumps({"n": i}) for i in range(10)} | {"bad": "[1"})
    port = free_port()
    log = tmp_path / "stream.log"
    process = spawn("stream", env(tree, queues, port), log)
    try:
        wait_for(
            lambda: (
                process.poll() is not None
                or (len(read(queues / "out")) == 10 and read(queues / "dead"))
            ),
            lambda: f"10 results and a dead letter:\n{log.read_text()}",
            POLL_TIMEOUT_S,
        )
        assert process.poll() is None, log.read_text()
        wait_for(lambda: not list((queues / "in").glob("*.json")), "every message acked")
    finally:
        stop(process)
    results = read(queues / "out")
    assert results == {
        f"m-{i}": {"body": {"echo": {"n": i}}, "headers": {"trace": f"t-m-{i}"}} for i in range(10)
    }
    dead = read(queues / "dead")
    assert list(dead) == ["bad"]
    assert dead["bad"]["body"]["error"]["type"] == "invalid_json"
    assert f"consumer(s) of toy://{queues / 'in'}" in log.read_text()


def test_without_its_table_line_start_up_refuses_the_scheme(tree: Path, tmp_path: Path) -> None:
    table = tree / "serving_core" / "stream" / "brokers.py"
    table.write_text(table.read_text().replace(LINE, "", 1))
    queues = tmp_path / "queues"
    produce(queues / "in", {"m-0": json.dumps({"n": 0})})
    ran = subprocess.run(
        [str(SERVING_CORE), "stream"],
        env=base_env(env(tree, queues, free_port())),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert ran.returncode != 0
    assert f"SERVING_STREAM_SOURCE='toy://{queues / 'in'}': toy:// names no broker" in ran.stderr
    assert "use a URL of one of amqp://, amqps://, redis://" in ran.stderr
    assert (queues / "in" / "m-0.json").exists()
