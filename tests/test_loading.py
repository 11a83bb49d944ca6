from __future__ import annotations

import json
import textwrap

import pytest

from serving_core.errors import HandlerError
from serving_core.handler import InvalidInput, call_batch
from serving_core.loading import load_handler

GOOD = """
from serving_core import Handler

class Upper(Handler):
    name = "upper"
    def predict(self, params):
        return {"text": params["text"].upper()}
"""


def write(tmp_path, source, name="handler.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_a_file_path_loads_its_one_handler_class(tmp_path):
    loaded = load_handler(str(write(tmp_path, GOOD)))
    assert type(loaded.handler).__name__ == "Upper"
    assert loaded.handler.predict({"text": "a"}) == {"text": "A"}
    assert loaded.sample is None


def test_a_folder_means_its_handler_py_and_sample_json_is_found(tmp_path):
    write(tmp_path, GOOD)
    (tmp_path / "sample.json").write_text(json.dumps({"text": "hi"}))
    loaded = load_handler(str(tmp_path))
    assert loaded.sample == {"text": "hi"}


@pytest.mark.example("echo")
def test_a_module_path_loads():
    loaded = load_handler("handlers.echo.handler")
    assert type(loaded.handler).__name__ == "Echo"
    assert loaded.sample == {"text": "hello"}


def test_the_handler_can_import_modules_beside_it(tmp_path):
    write(tmp_path, "SUFFIX = '!'\n", name="helpers_beside.py")
    write(
        tmp_path,
        """
        from serving_core import Handler
        from helpers_beside import SUFFIX

        class Shout(Handler):
            def predict(self, params):
                return {"text": params["text"] + SUFFIX}
        """,
    )
    assert load_handler(str(tmp_path)).handler.predict({"text": "a"}) == {"text": "a!"}


def test_a_class_can_be_picked_by_name(tmp_path):
    path = write(tmp_path, GOOD + "\nclass Other(Upper):\n    pass\n")
    assert type(load_handler(f"{path}:Other").handler).__name__ == "Other"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\n", "no Handler subclass found"),
        (GOOD + "\nclass Other(Upper):\n    pass\n", "several Handler subclasses (Other, Upper)"),
        (
            "from serving_core import Handler\nclass Nothing(Handler):\n    pass\n",
            "implements neither predict(params) -> dict nor predict_batch",
        ),
        ("import not_a_module_anywhere\n", "importing it failed"),
        ("def broken(:\n", "importing it failed"),
        (
            GOOD.replace('name = "upper"', 'input_schema = {"type": "nonsense"}'),
            "input_schema is not a valid JSON Schema",
        ),
        (
            GOOD.replace('name = "upper"', "def __init__(self, model):\n        pass"),
            "must take no arguments",
        ),
        (
            GOOD + "    def generate(self, item):\n        yield item\n",
            "answers only in chunks: keep generate(item) or step(generations)",
        ),
        (
            "from serving_core import Handler, TextGeneration\n"
            "class Text(Handler):\n    text = TextGeneration()\n"
            "    def predict(self, item):\n        return item\n",
            "sets text = TextGeneration(...) but does not generate",
        ),
    ],
)
def test_a_broken_handler_names_the_file_and_the_fix(tmp_path, source, expected):
    path = write(tmp_path, source)
    with pytest.raises(HandlerError) as info:
        load_handler(str(path))
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_a_missing_file_says_what_to_set(tmp_path):
    with pytest.raises(HandlerError, match="does not exist; set SERVING_HANDLER"):
        load_handler(str(tmp_path / "nope.py"))


def test_a_missing_module_says_what_to_set():
    with pytest.raises(HandlerError, match="was not found; set SERVING_HANDLER"):
        load_handler("no_such_package.handler")


def test_a_bad_class_name_is_refused(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(HandlerError, match="'Missing' is not a Handler subclass"):
        load_handler(f"{path}:Missing")


def test_a_sample_that_is_not_an_object_is_refused(tmp_path):
    write(tmp_path, GOOD)
    (tmp_path / "sample.json").write_text("[1, 2]")
    with pytest.raises(HandlerError, match="must hold one JSON object"):
        load_handler(str(tmp_path))


BATCHED = """
from serving_core import Handler, InvalidInput

class Batched(Handler):
    def __init__(self):
        self.reply = None
    def predict_batch(self, batch):
        return self.reply(batch)
"""


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (lambda batch: None, "returned NoneType; return a list with one dict per input"),
        (lambda batch: batch[:-1], "returned 1 outputs for 2 inputs"),
        (lambda batch: ["x" for _ in batch], "returned a str as an output"),
    ],
)
def test_predict_batch_breaking_the_contract_says_how_to_fix_it(tmp_path, reply, expected):
    handler = load_handler(str(write(tmp_path, BATCHED))).handler
    handler.reply = reply
    with pytest.raises(TypeError, match=expected):
        call_batch(handler, [{"a": 1}, {"a": 2}])


def test_predict_batch_may_mark_one_item_invalid(tmp_path):
    handler = load_handler(str(write(tmp_path, BATCHED))).handler
    bad = InvalidInput("no")
    handler.reply = lambda batch: [{"ok": 1}, bad]
    assert call_batch(handler, [{}, {}]) == [{"ok": 1}, bad]


def test_predict_batch_may_answer_with_a_tuple(tmp_path):
    handler = load_handler(str(write(tmp_path, BATCHED))).handler
    handler.reply = lambda batch: tuple({"n": item["a"]} for item in batch)
    assert call_batch(handler, [{"a": 1}, {"a": 2}]) == [{"n": 1}, {"n": 2}]


def test_a_handler_that_only_generates_loads(tmp_path):
    source = (
        "from serving_core import Handler\n"
        "class Words(Handler):\n"
        "    def generate(self, item):\n"
        "        yield {'text': 'a'}\n"
    )
    loaded = load_handler(str(write(tmp_path, source)))
    assert type(loaded.handler).__name__ == "Words"
