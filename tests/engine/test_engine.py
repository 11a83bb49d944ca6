"""The engine alone: no server, no thread, no queue."""

from __future__ import annotations

import pytest

from serving_core import InvalidInput, context
from serving_core.context import Context
from serving_core.engine.engine import Engine
from serving_core.errors import InvalidParams, ModelError
from serving_core.handler import Handler


class Words(Handler):
    name = "words"
    input_schema = {  # noqa: RUF012 (as a user writes it)
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }

    def __init__(self):
        self.batches = []
        self.seen_contexts = []

    def preprocess(self, params):
        if params["text"] == "reject-early":
            raise InvalidInput("rejected in preprocess")
        if params["text"] == "crash-early":
            raise RuntimeError("a bug in preprocess")
        ctx = context.current()
        return {"text": params["text"], "id": ctx.request_id if ctx else None}

    def predict_batch(self, items):
        self.batches.append([item["text"] for item in items])
        self.seen_contexts.append([c.request_id for c in context.batch()])
        if any(item["text"] == "bad" for item in items):
            raise InvalidInput("bad is not a word")
        if any(item["text"] == "boom" for item in items):
            raise RuntimeError("the model broke")
        return [{"words": len(item["text"].split()), "id": item["id"]} for item in items]

    def postprocess(self, output, params):
        return {**output, "echo": params["text"], "post_id": context.current().request_id}


def engine(max_batch_size=4):
    return Engine(Words(), max_batch_size=max_batch_size)


def test_predict_many_answers_each_item_in_order_in_batches_of_the_maximum():
    e = engine(max_batch_size=2)
    params = [{"text": t} for t in ("a", "a b", "a b c", "x y z w", "q")]
    results = e.predict_many(params)
    assert [r["words"] for r in results] == [1, 2, 3, 4, 1]
    assert [len(b) for b in e.handler.batches] == [2, 2, 1]


def test_every_hook_sees_its_requests_context():
    e = engine()
    contexts = [Context("req-1"), Context("req-2")]
    results = e.predict_many([{"text": "a"}, {"text": "b"}], contexts)
    assert [(r["id"], r["post_id"]) for r in results] == [("req-1", "req-1"), ("req-2", "req-2")]
    assert e.handler.seen_contexts == [["req-1", "req-2"]]
    assert context.current() is None  # nothing leaks out of the call
    assert context.batch() == ()


def test_a_bad_item_fails_alone_and_the_rest_are_answered():
    e = engine()
    params = [
        {"text": "fine"},
        {"txt": "schema"},
        {"text": "reject-early"},
        {"text": "bad"},
        {"text": "crash-early"},
        {"text": "also fine"},
    ]
    results = e.predict_many(params)
    assert results[0]["words"] == 1
    assert isinstance(results[1], InvalidParams)
    assert results[1].details == [{"field": "(root)", "message": "'text' is a required property"}]
    assert isinstance(results[2], InvalidParams)
    assert results[2].message == "rejected in preprocess"
    assert isinstance(results[3], InvalidParams)
    assert results[3].message == "bad is not a word"
    assert isinstance(results[4], ModelError)
    assert "item-4" in results[4].message
    assert results[5]["words"] == 2


def test_an_invalid_input_in_a_batch_is_found_by_halving_and_reported_in_calls():
    e = engine()
    items = [{"text": t, "id": None} for t in ("a", "bad", "c", "d")]
    ran = e.run(items, [Context(f"r{i}") for i in range(4)])
    assert [isinstance(r, InvalidParams) for r in ran.results] == [False, True, False, False]
    assert ran.calls > 1
    clean = e.run(items[:1], [Context("r0")])
    assert clean.calls == 1


def test_a_failing_model_fails_its_batch_with_the_request_ids_and_counts_it():
    failures = []
    e = Engine(Words(), max_batch_size=4, on_failure=failures.append)
    results = e.predict_many([{"text": "ok"}, {"text": "boom"}], [Context("a"), Context("b")])
    assert all(isinstance(r, ModelError) for r in results)
    assert "request id a" in results[0].message
    assert failures == [2]


def test_a_handler_returning_invalid_input_in_place_fails_that_item_only():
    class Marks(Handler):
        def predict_batch(self, items):
            return [InvalidInput("odd") if item["n"] % 2 else {"n": item["n"]} for item in items]

    e = Engine(Marks(), max_batch_size=8)
    results = e.predict_many([{"n": 0}, {"n": 1}])
    assert results[0] == {"n": 0}
    assert isinstance(results[1], InvalidParams)
    assert results[1].message == "odd"
    assert e.run([{"n": 1}, {"n": 2}], [Context("a"), Context("b")]).calls == 1  # no re-run


@pytest.mark.parametrize("size", [1, 3])
def test_an_unbatched_handler_runs_one_item_per_call(size):
    class One(Handler):
        calls = 0

        def predict(self, item):
            One.calls += 1
            return {"got": item["n"]}

    e = Engine(One(), max_batch_size=size)
    assert e.max_batch_size == 1
    assert e.predict_many([{"n": 1}, {"n": 2}]) == [{"got": 1}, {"got": 2}]
    assert One.calls == 2


class Short(Handler):
    name = "short"
    input_schema = {  # noqa: RUF012 (as a user writes it)
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 5}, "tags": {"minItems": 1}},
    }

    def predict_batch(self, items):
        return items


def test_a_broken_length_limit_is_named_in_the_error_with_its_value():
    [long, empty] = Engine(Short(), max_batch_size=4).predict_many(
        [{"text": "x" * 500}, {"tags": []}]
    )
    assert isinstance(long, InvalidParams)
    assert long.details[0]["field"] == "text"
    assert long.details[0]["message"].endswith("is too long (maxLength 5)")
    assert "x" * 100 not in long.message  # the client's value is still cut short
    assert isinstance(empty, InvalidParams)
    assert empty.details[0]["message"].endswith("(minItems 1)")
