from __future__ import annotations

import io

import pytest
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from serving_core.errors import BadRequest, UnsupportedMediaType
from serving_core.web.params import request_params


def make(data=None, content_type=None, query=None, **kwargs):
    builder = EnvironBuilder(
        method="POST", data=data, content_type=content_type, query_string=query, **kwargs
    )
    return Request(builder.get_environ())


def test_a_json_object_is_the_params():
    request = make(b'{"text": "hi", "n": 2, "tags": ["a"]}', "application/json")
    assert request_params(request) == {"text": "hi", "n": 2, "tags": ["a"]}


def test_json_with_a_charset_and_a_vendor_type_is_json():
    assert request_params(make(b'{"a": 1}', "application/json; charset=utf-8")) == {"a": 1}
    assert request_params(make(b'{"a": 1}', "application/vnd.api+json")) == {"a": 1}


def test_query_parameters_are_merged_and_the_body_wins():
    request = make(b'{"text": "body"}', "application/json", query="text=query&lang=en")
    assert request_params(request) == {"text": "body", "lang": "en"}


def test_a_repeated_query_parameter_becomes_a_list():
    assert request_params(make(query="tag=a&tag=b&x=1")) == {"tag": ["a", "b"], "x": "1"}


def test_urlencoded_form_fields_including_raw_utf8():
    request = make("text=h%C3%A9llo&word=caf\u00e9".encode(), "application/x-www-form-urlencoded")
    assert request_params(request) == {"text": "h\u00e9llo", "word": "caf\u00e9"}


def test_multipart_fields_and_an_uploaded_file_as_bytes():
    request = make(
        {"text": "hi", "image": (io.BytesIO(b"\x89PNG\x00\xff"), "a.png")},
        "multipart/form-data",
    )
    assert request_params(request) == {"text": "hi", "image": b"\x89PNG\x00\xff"}


def test_an_empty_multipart_form_is_no_fields():
    assert request_params(make(b"--B--\r\n", "multipart/form-data; boundary=B")) == {}


def test_no_body_and_no_content_type_is_just_the_query():
    assert request_params(make(query="a=1")) == {"a": "1"}


@pytest.mark.parametrize(
    ("data", "content_type", "expected"),
    [
        (b'{"text": ', "application/json", "malformed JSON at line 1"),
        (b'["a", "b"]', "application/json", "the JSON body is an array"),
        (b'"text"', "application/json", "the JSON body is a string"),
        (b"null", "application/json", "the JSON body is null"),
        (b"", "application/json", "the JSON body is empty"),
        (b'{"x": NaN}', "application/json", "malformed JSON at line 1 column 7"),
        (b'{"text": "\xff\xfe"}', "application/json", "not valid UTF-8"),
        (b"text=%FF%FE", "application/x-www-form-urlencoded", "not valid UTF-8"),
        # curl -d '{...}' without -H 'Content-Type: application/json'
        (b'{"text": "hi"}', "application/x-www-form-urlencoded", "not application/json"),
        (b' [{"text": "hi"}]', "application/x-www-form-urlencoded", "not application/json"),
        (b"text=\xff\xfe", "application/x-www-form-urlencoded", "not valid UTF-8"),
        (
            b'--B\r\nContent-Disposition: form-data; name="text"\r\n\r\n\xff\xfe\r\n--B--\r\n',
            "multipart/form-data; boundary=B",
            "not valid UTF-8",
        ),
        # Found by schemathesis (issue 42): werkzeug's silent parser served these as {}.
        (b"--B\r\nNone--B--\r\n", "multipart/form-data; boundary=B", "malformed multipart"),
        (
            b'--B\r\nContent-Disposition: form-data; name="text"\r\n\r\ncut short',
            "multipart/form-data; boundary=B",
            "end the body with the closing boundary",
        ),
        (b"garbage", "multipart/form-data; boundary=B", "malformed multipart"),
        (b"x", "multipart/form-data", "malformed multipart body: Missing boundary"),
    ],
)
def test_a_bad_body_is_a_400_that_says_what_is_wrong(data, content_type, expected):
    with pytest.raises(BadRequest, match=expected):
        request_params(make(data, content_type))


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", None])
def test_other_body_types_are_415(content_type):
    with pytest.raises(UnsupportedMediaType, match="send application/json"):
        request_params(make(b"hello", content_type))
