"""docs/streams.md's local block, run whole as written in a real bash: a scratch
redis-server, two messages queued with redis-cli, `serving-core stream` over the echo
handler, and the result and the dead letter read back with XREAD BLOCK. The block waits
for Redis itself and the runner adds no wait (tests/docs/test_readme.py says how blocks
are run); its ports become free ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.test_readme import ACTIVATE, session_env
from tests.readme import block_with, shell
from tests.servers import ROOT, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.example("echo")]

REDIS_PORT = "6390"  # the block's


def fields(output: str) -> dict[str, str]:
    """The fields of the one entry redis-cli prints for XREAD: the stream's name and the
    entry's id, then each field's name and value, a line each."""
    stream, _entry_id, *pairs = output.splitlines()
    assert len(pairs) % 2 == 0, output
    return {"stream": stream, **dict(zip(pairs[::2], pairs[1::2], strict=True))}


def test_the_local_stream_example_echoes_one_message_and_dead_letters_the_other(
    tmp_path: Path,
) -> None:
    block = block_with("SERVING_STREAM_SINK='redis://127.0.0.1:6390")
    worker = f"127.0.0.1:{free_port()}"
    text = block.text.replace("127.0.0.1:9090", worker).replace(REDIS_PORT, str(free_port()))
    env = {**session_env(tmp_path), "SERVING_WORKERS": "1"}
    with shell(ROOT, env, tmp_path / "shell") as session:
        assert session.run(ACTIVATE).returncode == 0
        ran = session.run_block(text, ready=None)
        for each in ran:
            assert each.returncode == 0, f"{each}\n{session.server_logs()}"
        *_, result, dead = ran
    echoed = fields(result.output)
    assert echoed["stream"] == "echoed", result
    assert echoed["id"] == "s-1"
    assert json.loads(echoed["body"]) == {"echo": {"text": "Paris is the capital of France."}}
    letter = fields(dead.output)
    assert letter["stream"] == "sentences.dead", dead
    assert (letter["id"], letter["error"]) == ("s-2", "invalid_json")
    assert json.loads(letter["body"])["input"] == "not json"
