"""errors: every ServingError pickles with its fields (it crosses the model process's socket)."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pytest

from serving_core import errors
from serving_core.errors import ServingError

# A value for each keyword an error class may take, none of them its default.
FIELDS: dict[str, Any] = {
    "details": {"field": "text", "limits": [1, 2.5]},
    "retry_after_s": 2.5,
    "reason": "deadline",
    "param": "messages",
    "idle_late": True,
}


def every_error(cls: type[ServingError] = ServingError) -> list[type[ServingError]]:
    found = [cls]
    for sub in cls.__subclasses__():
        found += every_error(sub)
    return found


def raised(cls: type[ServingError]) -> tuple[ServingError, dict[str, Any]]:
    """An instance of ``cls`` with every keyword it takes set, and those keywords."""
    takes = inspect.signature(cls).parameters
    unknown = set(takes) - {"message", *FIELDS}
    assert not unknown, f"{cls.__name__} takes {unknown}: give FIELDS a value for each"
    given = {name: value for name, value in FIELDS.items() if name in takes}
    return cls(f"{cls.__name__} on purpose", **given), given


@pytest.mark.parametrize("cls", every_error(), ids=lambda cls: cls.__name__)
def test_every_serving_error_round_trips_through_pickle_with_its_fields(cls):
    error, given = raised(cls)
    error.add_note("a note, too")
    copy = pickle.loads(pickle.dumps(error, protocol=5))
    assert type(copy) is cls
    assert copy.message == str(copy) == f"{cls.__name__} on purpose"
    assert copy.args == error.args
    for name, value in given.items():
        assert getattr(copy, name) == value, name
    assert vars(copy) == vars(error)
    assert copy.body() == error.body()
    assert (copy.status, copy.type) == (error.status, error.type)


class StageDown(errors.BadGateway):
    """A subclass whose ``__init__`` takes other arguments than ServingError's."""

    def __init__(self, stage: str, *, attempts: int) -> None:
        super().__init__(f"stage {stage!r} is down", details={"stage": stage}, retry_after_s=3.0)
        self.stage = stage
        self.attempts = attempts


def test_a_subclass_with_its_own_arguments_round_trips_without_calling_its_init():
    error = StageDown("embed", attempts=2)
    copy = pickle.loads(pickle.dumps(error, protocol=5))
    assert type(copy) is StageDown
    assert (copy.message, copy.details, copy.retry_after_s) == (
        "stage 'embed' is down",
        {"stage": "embed"},
        3.0,
    )
    assert (copy.stage, copy.attempts) == ("embed", 2)
