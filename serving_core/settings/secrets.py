"""A URL as an error or a log line may show it: the password of its user info, and
the values of query parameters that name a secret, replaced by ``***``.

Every layer masks through ``masked``: a URL is logged, a password never. A
library's message about a URL (a driver's error) goes through ``scrubbed``,
which hides the same secrets wherever the message repeats them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import unquote

HIDDEN = "***"
# Query parameters that carry a secret: redis-py's password= (the only way a
# unix:// URL carries one), a Kafka URL's sasl_password=, pass=, pwd=, a token=,
# auth= and API keys, and a presigned URL's (S3's X-Amz-Signature= and
# X-Amz-Credential=, GCS's X-Goog-Signature=, an Azure SAS's sig=). The value runs
# to the next parameter: a raw '#' is kept in it, and so is a raw '&' that no
# 'NAME=' follows (a parser would drop that piece, but it is the password's).
_SECRET_PARAMETER = re.compile(
    r"(?P<name>(?:^|(?<=[?&#]))(?:[^=&]*(?:pass|pwd|secret|token|signature|credential|auth"
    r"|api[-_]?key|access[-_]?key|private[-_]?key)[^=&]*|sig|key)=)"
    r"(?P<value>[^&]*(?:&[^&=]*(?=&|$))*)",
    re.IGNORECASE,
)


def masked(url: str) -> str:
    """``url`` with its password (``user:PASSWORD@``) and secret query values hidden.

    The user info ends at the last ``@`` before the query: a password holding a raw
    ``@`` or ``/`` (which a URL should escape, and people often do not) is hidden
    whole, and so is one holding a raw ``?`` or ``#`` (its ``@`` then follows
    them) but no ``=``, which would make what follows them a query. A path
    holding a raw ``@`` is hidden with it: too much rather than too little. A
    user without a password is shown; so is a URL without one. A value whose
    ``SCHEME://`` was left out is read as the rest of a URL.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:  # a URL whose scheme was left out may still carry a password
        scheme, rest = "", url
    at = _userinfo_end(rest)
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        if colon:
            rest = f"{user}:{HIDDEN}{rest[at:]}"
    head, mark, query = _split_query(rest)
    if mark:
        query = _SECRET_PARAMETER.sub(lambda found: found["name"] + HIDDEN, query)
    return f"{scheme}{sep}{head}{mark}{query}"


def scrubbed(text: str, url: str) -> str:
    """``text`` (a library's message about ``url``) with ``url`` masked and each of its
    secrets, as written or percent-decoded, hidden wherever it stands alone."""
    text = text.replace(url, masked(url)) if url else text
    for secret in sorted(set(_secrets(url)), key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", HIDDEN, text)
    return text


def _secrets(url: str) -> Iterator[str]:
    rest = url.partition("://")[2] or url
    at = _userinfo_end(rest)
    if at >= 0:
        yield from _forms(rest[:at].partition(":")[2])
    _, mark, query = _split_query(rest)
    if mark:
        for found in _SECRET_PARAMETER.finditer(query):
            yield from _forms(found["value"])


def _forms(secret: str) -> Iterator[str]:
    if secret:
        yield secret
        yield unquote(secret)


def _userinfo_end(rest: str) -> int:
    """The index of the ``@`` that ends ``rest``'s user info, or -1."""
    head, _, _ = _split_query(rest)
    # A password holding a raw '?' or '#' has its '@' after them, where a query's
    # parameters (?stream=a@b) would hold a '='.
    last = rest.rfind("@")
    user, colon, _ = rest[: max(last, 0)].partition(":")
    if last > len(head) and colon and "/" not in user and "=" not in rest[len(head) : last]:
        return last
    return head.rfind("@")


def _split_query(rest: str) -> tuple[str, str, str]:
    """(authority and path, "?" or "#" or "", what follows it)."""
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    if cut < 0:
        return rest, "", ""
    return rest[:cut], rest[cut], rest[cut + 1 :]
