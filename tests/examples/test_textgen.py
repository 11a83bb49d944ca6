"""The text generator example (handlers/textgen): real transformers generation, trained here.

The model is trained once (``setup()`` trains it when $TEXTGEN_MODEL_DIR, by
default handlers/textgen/model, has none: about a minute) and every test and
server of the session loads it. The continuous-batching tests drive the
handler's steps by hand, so that a sequence joins others mid-generation with
caches of other lengths, and check that it gets the tokens it gets alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import requests

from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.engine.stepper import Chunk, Stepper, ends
from serving_core.errors import InvalidParams, ServingError
from serving_core.generation import Generation
from serving_core.loading import load_handler
from tests.example_handlers import example_module
from tests.servers import ROOT, gunicorn_server

example_module("textgen", "transformers")  # installed by handlers/textgen/requirements.txt

pytestmark = [pytest.mark.model, pytest.mark.example("textgen")]

FOLDER = ROOT / "handlers" / "textgen"
PROMPTS = ["And God said", "In the beginning", "And Abraham", "Joseph"]


@pytest.fixture(scope="module")
def handler() -> Any:
    loaded = load_handler(str(FOLDER / "handler.py"))
    loaded.handler.setup()  # trains the model first when there is none
    loaded.handler.setup_worker()
    return loaded.handler


@pytest.fixture(scope="module")
def engine(handler: Any) -> Engine:
    return Engine(handler, max_batch_size=8, max_tokens=256)


def words_of(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]+", text)


def texts(results: list[Any]) -> list[str]:
    assert all(isinstance(r, dict) for r in results), results
    return [r["text"] for r in results]


def test_greedy_output_is_word_like_and_the_same_every_time(engine: Engine) -> None:
    params = [{"prompt": p, "max_tokens": 40} for p in PROMPTS]
    first = texts(engine.predict_many(params))
    assert texts(engine.predict_many(params)) == first
    known = set(words_of((FOLDER / "genesis.txt").read_text()))
    generated = [w for text in first for w in words_of(text)]
    assert len(generated) >= 40, first
    assert sum(w in known for w in generated) / len(generated) >= 0.9, first


def run(handler: Any, plan: list[tuple[int, dict[str, Any]]], max_steps: int = 200) -> list[str]:
    """Each ``(step, params)`` starts at that step and runs with the others until it
    ends; what each one generated, in ``plan``'s order."""
    stepper = Stepper(handler)
    gens = [
        Generation(handler.preprocess(p), Context(f"g{i}"), p["max_tokens"])
        for i, (_, p) in enumerate(plan)
    ]
    out = [""] * len(plan)
    running: list[int] = []
    for step in range(max_steps):
        running += [i for i, (start, _) in enumerate(plan) if start == step]
        if not running and step > max(start for start, _ in plan):
            return out
        answers = stepper.step([gens[i] for i in running])
        for i, answer in zip(running, answers, strict=True):
            out[i] += "".join(e.output["text"] for e in answer if isinstance(e, Chunk))
            assert not any(isinstance(e, ServingError) for e in answer), answer
        running = [i for i, a in zip(running, answers, strict=True) if not ends(a)]
    raise AssertionError(f"not done in {max_steps} steps")


def test_a_sequence_gets_the_same_greedy_tokens_alone_as_joining_a_running_batch(
    handler: Any,
) -> None:
    # A long prompt joins a shorter running batch (the batch is padded), a short one
    # joins a longer batch (it is padded), and one leaves early (columns dropped).
    long_prompt = "And the LORD God formed man of the dust of the ground, and breathed"
    plan = [
        (0, {"prompt": "Joseph", "max_tokens": 30}),
        (0, {"prompt": "And Abraham said", "max_tokens": 6}),
        (3, {"prompt": long_prompt, "max_tokens": 25}),
        (9, {"prompt": "Now", "max_tokens": 20}),
        (12, {"prompt": "And God said", "max_tokens": 5, "stop": "zzz"}),
    ]
    together = run(handler, plan)
    alone = [run(handler, [(0, params)])[0] for _, params in plan]
    assert together == alone
    assert all(together), together


def test_sampling_with_a_seed_repeats_alone_and_in_company(handler: Any) -> None:
    sampled = {"prompt": "And Jacob", "max_tokens": 20, "temperature": 0.9, "seed": 7}
    alone = run(handler, [(0, sampled)])[0]
    company = run(handler, [(0, {"prompt": "Joseph", "max_tokens": 30}), (2, sampled)])[1]
    assert alone == company
    greedy = run(handler, [(0, {"prompt": "And Jacob", "max_tokens": 20})])[0]
    top = {**sampled, "top_p": 0.01}  # the one most likely token: greedy
    assert run(handler, [(0, top)])[0] == greedy


def test_a_stop_string_ends_the_text_before_it(engine: Engine) -> None:
    (whole,) = texts(engine.predict_many([{"prompt": "And God said", "max_tokens": 40}]))
    stop = whole[10:14]
    (cut,) = texts(
        engine.predict_many([{"prompt": "And God said", "max_tokens": 40, "stop": [stop]}])
    )
    assert cut == whole[: whole.index(stop)]


def test_a_prompt_longer_than_the_context_is_a_400(engine: Engine) -> None:
    (result,) = engine.predict_many([{"prompt": "and " * 600, "max_tokens": 8}])
    assert isinstance(result, InvalidParams)
    assert "shorten" in str(result)


def sse_events(response: requests.Response) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for frame in response.text.split("\n\n"):
        if not frame.strip():
            continue
        event: dict[str, Any] = {}
        for line in frame.splitlines():
            key, _, value = line.partition(": ")
            event[key] = json.loads(value) if key == "data" else value
        events.append(event)
    return events


@pytest.mark.e2e
def test_the_server_streams_each_token_as_an_event_then_the_end(engine: Engine) -> None:
    params = {"prompt": "In the beginning", "max_tokens": 12}
    (expected,) = texts(engine.predict_many([params]))
    env = {"SERVING_HANDLER": str(FOLDER), "SERVING_WORKERS": "1"}
    with gunicorn_server(env, ready_timeout_s=240) as server:
        streamed = requests.post(
            server.url + "/predict",
            json=params,
            headers={"Accept": "text/event-stream"},
            timeout=60,
        )
        whole = requests.post(server.url + "/predict", json=params, timeout=60)
    assert streamed.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(streamed)
    chunks, end = events[:-1], events[-1]
    assert [e["id"] for e in chunks] == [str(i) for i in range(1, 13)]
    assert "".join(e["data"]["text"] for e in chunks) == expected
    assert end == {"event": "end", "data": {"finish_reason": "length", "chunks": 12}}
    assert whole.json() == {"text": expected}


def test_the_model_folder_is_where_the_variable_says(
    handler: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    train = example_module("textgen", "train")  # beside the handler, on its path
    monkeypatch.setenv(train.MODEL_DIR_VARIABLE, str(tmp_path / "elsewhere"))
    assert train.model_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv(train.MODEL_DIR_VARIABLE)
    assert train.model_dir() == FOLDER / "model"
