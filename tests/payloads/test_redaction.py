"""Fields redacted by name, at any depth, in any case; the rest left as it was."""

from __future__ import annotations

import copy

from serving_core.payloads.redaction import DEFAULT, REDACTED, Redaction


def test_the_default_names_are_redacted_in_any_case():
    value = {"API_KEY": "k", "ApiKey": "k", "Authorization": "Bearer x", "password": "p"}
    value["Token"] = {"nested": "whole value"}
    assert Redaction()(value) == dict.fromkeys(value, REDACTED)
    assert set(DEFAULT) == {"api_key", "apikey", "authorization", "password", "token"}


def test_names_are_redacted_in_dicts_nested_in_dicts_and_lists():
    value = {
        "text": "kept",
        "user": {"email": "a@b.c", "name": "Ann", "cards": [{"ssn": "123"}, {"ssn": "456"}]},
        "rows": [[{"Email": "x@y.z"}], ("tuple", {"email": "t@u.v"})],
    }
    redacted = Redaction(["email", "SSN"])(value)
    assert redacted == {
        "text": "kept",
        "user": {
            "email": REDACTED,
            "name": "Ann",
            "cards": [{"ssn": REDACTED}, {"ssn": REDACTED}],
        },
        "rows": [[{"Email": REDACTED}], ["tuple", {"email": REDACTED}]],
    }


def test_the_original_is_never_changed():
    value = {"password": "p", "inner": [{"token": "t"}]}
    before = copy.deepcopy(value)
    Redaction()(value)
    assert value == before


def test_a_value_without_redacted_names_is_returned_as_it_is():
    value = {"text": "a", "list": [1, 2, {"x": None}], 3: "an int key"}
    assert Redaction(["email"])(value) is value


def test_only_names_are_matched_not_values():
    assert Redaction()({"text": "password"}) == {"text": "password"}
