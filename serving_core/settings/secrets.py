"""A URL as an error or a log line may show it: the password of its user info, and
the values of query parameters that name a secret, replaced by ``***``.

Every layer masks through ``masked``: a URL is logged, a password never.
"""

from __future__ import annotations

import re

HIDDEN = "***"
# Query parameters that carry a secret: a Kafka URL's sasl_password=, a token=, and
# a presigned URL's (S3's X-Amz-Signature= and X-Amz-Credential=, GCS's
# X-Goog-Signature=, an Azure SAS's sig=).
_SECRET_PARAMETER = re.compile(
    r"(?P<name>(?:^|[?&])(?:[^=&#]*(?:password|passwd|secret|token|signature|credential)"
    r"[^=&#]*|sig)=)[^&#]*",
    re.IGNORECASE,
)


def masked(url: str) -> str:
    """``url`` with its password (``user:PASSWORD@``) and secret query values hidden.

    The user info ends at the last ``@`` before the query: a password holding a raw
    ``@`` or ``/`` (which a URL should escape, and people often do not) is hidden
    whole. A path holding a raw ``@`` is hidden with it: too much, never too
    little. A user without a password is shown; so is a URL without one. A
    value whose ``SCHEME://`` was left out is read as the rest of a URL.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:  # a URL whose scheme was left out may still carry a password
        scheme, rest = "", url
    head, mark, query = _split_query(rest)
    at = head.rfind("@")
    if at >= 0:
        user, colon, _ = head[:at].partition(":")
        if colon:
            head = f"{user}:{HIDDEN}{head[at:]}"
    if mark:
        query = _SECRET_PARAMETER.sub(lambda found: found["name"] + HIDDEN, query)
    return f"{scheme}{sep}{head}{mark}{query}"


def _split_query(rest: str) -> tuple[str, str, str]:
    """(authority and path, "?" or "#" or "", what follows it)."""
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    if cut < 0:
        return rest, "", ""
    return rest[:cut], rest[cut], rest[cut + 1 :]
