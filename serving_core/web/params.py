"""Turns an HTTP request into the plain ``dict`` a handler receives.

- A JSON object body (``application/json`` or any ``+json`` type).
- Form fields (``application/x-www-form-urlencoded`` or ``multipart/form-data``);
  an uploaded file arrives as ``bytes`` under its field name.
- Query-string parameters are merged in; on a clash the body wins.
- A name given several times (``?tag=a&tag=b``) becomes a list of its values.

Malformed JSON, a JSON body that is not an object, invalid UTF-8, and JSON sent
as a urlencoded form (``curl -d`` without a Content-Type) are 400s;
any other body type is a 415. The size limit (413) is enforced by Flask's
``MAX_CONTENT_LENGTH`` before the body is read; a JSON body nested deeper than
``JsonLimits.max_depth`` or with a string longer than ``max_string_chars`` is a
400, found while it is parsed (``encoding.loads_limited``).
"""

from __future__ import annotations

import urllib.parse
from typing import Any, NamedTuple

from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import ClientDisconnected
from werkzeug.wrappers import Request

from serving_core import encoding
from serving_core.errors import QUOTE_CHARS, BadRequest, UnsupportedMediaType, quote, shorten

MAX_FIELDS = 1000  # werkzeug's own default for multipart parts
ACCEPTED = "application/json, application/x-www-form-urlencoded or multipart/form-data"


class JsonLimits(NamedTuple):
    """What a JSON body may hold (``SERVING_MAX_JSON_DEPTH``, ``SERVING_MAX_STRING_CHARS``);
    the defaults are orjson's own depth limit and no string limit."""

    max_depth: int = encoding.ORJSON_MAX_DEPTH
    max_string_chars: int = 1 << 62


NO_LIMITS = JsonLimits()


def request_params(request: Request, limits: JsonLimits = NO_LIMITS) -> dict[str, Any]:
    # Most requests have no query string: skip building its empty MultiDict.
    params = _flatten(request.args) if request.environ.get("QUERY_STRING") else {}
    params.update(body_params(request, limits))
    return params


def body_params(request: Request, limits: JsonLimits = NO_LIMITS) -> dict[str, Any]:
    mimetype = request.mimetype
    if mimetype == "application/json" or mimetype.endswith("+json"):
        return json_object(_body(request), limits)
    if mimetype == "application/x-www-form-urlencoded":
        return _urlencoded(_body(request))
    if mimetype == "multipart/form-data":
        return _multipart(request)
    if not mimetype and not _has_body(request):
        return {}
    raise UnsupportedMediaType(
        f"unsupported Content-Type {quote(request.content_type or '(none)')}; send {ACCEPTED}"
    )


def _body(request: Request) -> bytes:
    """The whole body. With a Content-Length within the limit, from a server that ends
    the body's stream itself (gunicorn sets ``wsgi.input_terminated``): one read of
    ``wsgi.input``. werkzeug's limit wrapper would read it in 64 KiB steps, each
    through a new zeroed buffer, a cost every small request pays. Anything else
    (chunked, over the limit) goes through werkzeug, which refuses what it must."""
    environ = request.environ
    length = request.content_length
    limit = request.max_content_length
    over = limit is not None and length is not None and length > limit
    if length is None or over or "wsgi.input_terminated" not in environ:
        return request.get_data(cache=False)
    try:
        data: bytes = environ["wsgi.input"].read(length)
    except (OSError, ValueError):
        raise ClientDisconnected() from None  # as werkzeug's stream says it
    if len(data) < length:
        raise ClientDisconnected()
    return data


def _has_body(request: Request) -> bool:
    return bool(request.content_length) or "chunked" in request.headers.get("Transfer-Encoding", "")


def json_object(data: bytes, limits: JsonLimits) -> dict[str, Any]:
    if not data.strip():
        raise BadRequest('the JSON body is empty; send an object such as {"text": "..."}')
    try:
        value = encoding.loads_limited(
            data, max_depth=limits.max_depth, max_string_chars=limits.max_string_chars
        )
    except encoding.TooDeep:
        raise BadRequest(
            f"the JSON body nests deeper than {limits.max_depth} levels "
            "(SERVING_MAX_JSON_DEPTH); send a flatter body"
        ) from None
    except encoding.StringTooLong as exc:
        raise BadRequest(
            f"the JSON body holds a string of {exc.chars} characters, more than "
            f"SERVING_MAX_STRING_CHARS={limits.max_string_chars} allows; send shorter text"
        ) from None
    except encoding.JSONDecodeError as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise BadRequest(
                f"the body is not valid UTF-8 (byte {bad.start}); encode the JSON as UTF-8"
            ) from None
        raise BadRequest(
            f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(value, dict):
        raise BadRequest(
            f"the JSON body is {_json_type(value)}; send an object of named parameters"
        )
    return value


def _urlencoded(data: bytes) -> dict[str, Any]:
    # curl -d sends this type unless told otherwise. A form's own braces are
    # percent-encoded, so a body that opens with one is JSON sent under the wrong
    # type; parsed as a form it would become one field named after the whole body.
    if data.lstrip()[:1] in (b"{", b"["):
        raise BadRequest(
            "the body looks like JSON but its Content-Type is "
            "application/x-www-form-urlencoded (curl -d's default), not application/json; "
            "send it with the header 'Content-Type: application/json'"
        )
    # Parsed here rather than by werkzeug, which silently drops or keeps
    # percent-escapes for bytes that are not UTF-8 instead of refusing them.
    try:
        pairs = urllib.parse.parse_qsl(
            data.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=False,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_FIELDS,
        )
    except UnicodeDecodeError:
        raise BadRequest("the form is not valid UTF-8; percent-encode UTF-8 text") from None
    except ValueError as exc:
        raise BadRequest(f"malformed form body: {shorten(str(exc), QUOTE_CHARS)}") from None
    return _flatten(MultiDict(pairs))


def _multipart(request: Request) -> dict[str, Any]:
    # Not request.form: werkzeug's parser is silent there, and a cut or malformed body
    # (no closing boundary, a part without its headers) would be served as an empty form.
    parser = request.make_form_data_parser()
    parser.silent = False
    try:
        _, form, files = parser.parse(
            request.stream, request.mimetype, request.content_length, request.mimetype_params
        )
    except ValueError as exc:
        raise BadRequest(
            f"malformed multipart body: {shorten(str(exc), QUOTE_CHARS)}; send each part "
            "with its headers, and end the body with the closing boundary"
        ) from None
    params = _flatten(form)
    for name, uploads in files.lists():
        contents = []
        for upload in uploads:
            try:
                contents.append(upload.read())
            finally:
                upload.close()  # spooled to a temp file past a size: free it now
        params[name] = contents[0] if len(contents) == 1 else contents
    for key, value in params.items():
        # werkzeug decodes multipart text fields with errors="replace"; a
        # replacement character is the only trace of bytes that were not UTF-8.
        if isinstance(value, str) and "\ufffd" in value:
            raise BadRequest(
                f"form field {quote(key)} is not valid UTF-8; encode the form as UTF-8"
            )
    return params


def _flatten(multi: MultiDict[str, Any]) -> dict[str, Any]:
    return {key: values[0] if len(values) == 1 else values for key, values in multi.lists()}


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
