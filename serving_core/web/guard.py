"""Who may call: API keys, private endpoints and CORS, as hooks on the Flask app.

- Keys (``SERVING_API_KEYS``, ``SERVING_API_KEYS_FILE``): when there are any,
  every request but ``/healthz``, ``/readyz`` and a CORS preflight needs one,
  as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``; otherwise 401
  with ``WWW-Authenticate``. A key is compared with every key, in constant
  time, as SHA-256 digests (so neither the match nor the length shows in the
  timing); only the digests are kept. The keys file is re-read when it
  changes (a Kubernetes Secret volume is updated in place).
- With keys, ``/metadata`` (the handler's path, live queue state) and
  ``/openapi.json`` need one too, unless ``SERVING_PUBLIC_METADATA``;
  ``/metrics`` stays open, so that Prometheus scrapes without a key (the chart
  serves it only on nginx's metrics port). ``SERVING_PRIVATE_ENDPOINTS`` puts
  all three behind the keys, or stops serving them (``/docs`` with them) when
  there are no keys.
- CORS (``SERVING_CORS_ORIGINS``) is flask-cors over the listed origins;
  without origins the app sends no CORS headers. ``X-Cache`` is exposed to
  pages only when it is sent at all (``SERVING_CACHE_HEADER``).
- Who called: a request that passed with a key has a caller (``caller()``), a
  digest of the key: it owns the jobs it submits (``online.jobsapi``) and, unless
  ``SERVING_CACHE_PER_KEY`` is off, its own inference cache entries. The digest
  is stored; the key never is.

No key is ever logged or echoed: messages name the header, never its value.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from flask import Flask, g, request
from flask_cors import CORS
from werkzeug.datastructures import Headers

from serving_core.errors import NotFound, Unauthorized
from serving_core.settings import Settings, SettingsError
from serving_core.settings.parsers import MIN_KEY_CHARS, api_keys

log = logging.getLogger("serving_core.web.guard")

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# Without SERVING_PRIVATE_ENDPOINTS: open even with keys, so Prometheus needs none.
PUBLIC_PATHS = frozenset({"/metrics"})
# What the API is and holds: behind the keys unless SERVING_PUBLIC_METADATA.
DESCRIPTION_PATHS = frozenset({"/metadata", "/openapi.json"})
# The V2 protocol's own descriptions (server and model metadata), held to the same
# rules as DESCRIPTION_PATHS (finding I5); readiness and inference are not these.
V2_DESCRIPTION = re.compile(r"/v2/?|/v2/models/[^/]+(/versions/[^/]+)?/?")
KEY_HEADER = "X-API-Key"
# How often a worker looks at the keys file's mtime: a rotated Secret is taken
# within this long, and a request costs no stat.
RELOAD_S = 10.0
# What a browser may send and read across origins: the API's own headers.
CORS_HEADERS = [
    "Authorization",
    KEY_HEADER,
    "Content-Type",
    "X-Request-ID",
    "X-Request-Timeout",
    "Idempotency-Key",
]
CORS_EXPOSED = ["X-Request-ID", "Retry-After", "Location", "WWW-Authenticate"]
CORS_MAX_AGE_S = 600
_FILE_VAR = "SERVING_API_KEYS_FILE"
EXTENSION = "serving_core.guard"  # where the app keeps its Guard (``app.extensions``)


# The caller's identity is a digest apart from the check's (its own prefix): what is
# stored with a job says nothing about the digests the check compares.
_CALLER_PREFIX = b"serving-core caller\0"
CALLER_HEX = 32  # 128 bits: no two keys share one


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def caller_of(presented: str) -> str:
    """The identity of the key ``presented``: a hex digest, never the key."""
    key = presented.encode("latin-1", "replace")
    return hashlib.sha256(_CALLER_PREFIX + key).hexdigest()[:CALLER_HEX]


def caller() -> str:
    """This request's caller: its key's identity, or ``""`` when the API has no keys."""
    return str(g.get("caller", ""))


class ApiKeys:
    """The keys a caller may present: from the setting, plus the file's (re-read on change).

    A changed file is taken line by line: its keys replace the file's old ones at
    once (a key removed is revoked), and a line that is not a key is left out and
    reported, as is a file that cannot be read or holds no key (``fault``: on
    ``/readyz``, in the log, as the ``observe`` gauge). Never the old set kept, and
    never open: with a keys file configured, the check stays on.
    """

    def __init__(
        self, keys: Iterable[str], path: str = "", observe: Callable[[int], None] | None = None
    ) -> None:
        self._fixed = [_digest(key.encode("ascii")) for key in keys]
        self._path = path
        self._observe = observe
        self._from_file: list[bytes] = []
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self.fault: str | None = None  # what is wrong with the keys file, for /readyz
        if path:
            self._load(first=True)

    def __bool__(self) -> bool:
        return bool(self._fixed or self._path)

    def refresh(self) -> None:
        """Re-read the keys file if it may have changed (at most every ``RELOAD_S``)."""
        if self._path and time.monotonic() - self._checked > RELOAD_S:
            self._load(first=False)

    def allows(self, presented: str | None) -> bool:
        if presented is None:
            return False
        self.refresh()
        # Header values are latin-1 strings (WSGI); any byte string hashes.
        given = _digest(presented.encode("latin-1", "replace"))
        matched = False
        # Every key, whatever matched first: the time does not say which.
        for digest in self._fixed + self._from_file:
            matched |= hmac.compare_digest(digest, given)
        return matched

    def _load(self, *, first: bool) -> None:
        self._checked = time.monotonic()
        stamp: tuple[int, int] | None = None
        bad: list[int] = []
        try:
            info = os.stat(self._path)
            stamp = (info.st_mtime_ns, info.st_size)
            if stamp == self._stamp:
                return
            keys, bad = _file_keys(Path(self._path).read_bytes())
        except OSError as exc:
            # Only the error's kind: its text would repeat the path.
            stamp, keys = None, []
            fault: str | None = f"cannot be read ({exc.__class__.__name__})"
        else:
            fault = _fault(keys, bad)
        if first and fault:
            raise SettingsError(
                f"{_FILE_VAR}={self._path!r} cannot be used: it {fault}; mount a file of "
                "keys, one per line (the chart mounts serving.apiKeysSecret)"
            )
        self._from_file = [_digest(key.encode("ascii")) for key in keys]
        self._stamp = stamp
        if fault and fault != self.fault:
            log.error(
                "%s %s: %d key(s) from it now pass, /readyz answers 503 until it is fixed",
                _FILE_VAR,
                fault,
                len(keys),
            )
        elif not first and fault is None:
            log.info("%s changed: %d keys now", _FILE_VAR, len(keys))
        self.fault = fault
        if self._observe is not None:
            self._observe(0 if fault is None else max(1, len(bad)))


def _file_keys(content: bytes) -> tuple[list[str], list[int]]:
    """The keys of a keys file, and the numbers of its lines that are not keys."""
    keys: list[str] = []
    bad: list[int] = []
    for number, line in enumerate(content.splitlines(), 1):
        try:
            keys.extend(api_keys(_FILE_VAR, line.decode("ascii")))
        except (UnicodeDecodeError, ValueError):
            bad.append(number)  # never quoted: a malformed line may still be a secret
    return keys, bad


def _fault(keys: list[str], bad: list[int]) -> str | None:
    if bad:
        shown = ", ".join(str(n) for n in bad[:10]) + (", ..." if len(bad) > 10 else "")
        return (
            f"has {len(bad)} line(s) that are not keys (line {shown}: each key is "
            f"{MIN_KEY_CHARS} or more printable ASCII characters; make keys with e.g. "
            "`openssl rand -hex 32`)"
        )
    if not keys:
        return "holds no keys (one per line)"
    return None


def presented_key(headers: Headers) -> str | None:
    """The key a request carries: ``Authorization: Bearer <key>``, else ``X-API-Key``."""
    scheme, _, token = headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get(KEY_HEADER) or None


class Guard:
    """The keys check and the private endpoints of one app, built from ``settings``."""

    def __init__(self, settings: Settings, observe: Callable[[int], None] | None = None) -> None:
        self.keys = ApiKeys(settings.api_keys, settings.api_keys_file, observe)
        self.private = settings.private_endpoints
        # What passes without a key when there are keys.
        self.public = frozenset(
            ()
            if settings.private_endpoints
            else (PUBLIC_PATHS | DESCRIPTION_PATHS if settings.public_metadata else PUBLIC_PATHS)
        )
        self.cors = bool(settings.cors_origins)

    @property
    def serves_private_paths(self) -> bool:
        """Whether /metadata, /openapi.json, /metrics (and /docs) exist at all."""
        return not self.private or bool(self.keys)

    def check(self) -> None:
        """A ``before_request`` hook: raises ``Unauthorized`` unless the request may pass,
        and ``NotFound`` for a V2 description the server does not serve."""
        path = request.path
        v2_description = request.method == "GET" and V2_DESCRIPTION.fullmatch(path) is not None
        if v2_description and not self.serves_private_paths:
            raise NotFound("not served: SERVING_PRIVATE_ENDPOINTS is on and no API keys are set")
        if not self.keys:
            return
        if path in OPEN_PATHS or path in self.public:
            return
        if v2_description and "/metadata" in self.public:
            return  # SERVING_PUBLIC_METADATA
        if self.cors and _is_preflight():
            return  # a browser never sends credentials on a preflight
        presented = presented_key(request.headers)
        if presented is None:
            raise Unauthorized(
                f"this API needs a key: send Authorization: Bearer <key> or {KEY_HEADER}: <key>"
            )
        if not self.keys.allows(presented):
            raise Unauthorized("the API key is not one this server accepts; check the key")
        g.caller = caller_of(presented)


def _is_preflight() -> bool:
    return (
        request.method == "OPTIONS"
        and "Origin" in request.headers
        and "Access-Control-Request-Method" in request.headers
    )


def enable_cors(app: Flask, origins: tuple[str, ...], *, cache_header: bool = False) -> None:
    """CORS headers for ``origins`` (exact matches, or ``*``); nothing when empty.
    ``cache_header``: ``X-Cache`` is sent, so pages may read it."""
    if not origins:
        return
    allowed: list[str | re.Pattern[str]] = (
        ["*"]
        if origins == ("*",)
        # Compiled, anchored and escaped: flask-cors would read a string with
        # regex characters (an IPv6 origin's brackets) as a pattern.
        else [re.compile(re.escape(origin) + r"\Z", re.IGNORECASE) for origin in origins]
    )
    CORS(
        app,
        origins=allowed,
        methods=["GET", "POST", "DELETE"],
        allow_headers=CORS_HEADERS,
        expose_headers=[*CORS_EXPOSED, "X-Cache"] if cache_header else CORS_EXPOSED,
        max_age=CORS_MAX_AGE_S,
        send_wildcard=origins == ("*",),
        # Keys travel in headers, not cookies: no credentialed requests.
        supports_credentials=False,
        always_send=False,
        vary_header=True,
        intercept_exceptions=False,
    )
