"""When a request really arrived, so that its deadline counts from there.

A request can wait before the app sees it: in nginx, and inside a gunicorn
gthread worker whose threads are all busy (the connection is readable, its
request sits in the worker's thread-pool queue). Two stamps make that wait
visible; the earliest of them and the app's own clock is the arrival:

- ``X-Request-Start: t=<unix seconds>``, set by nginx (``t=${msec}``) or any
  proxy in the same convention (seconds, milliseconds or microseconds), and
  believed only from a trusted proxy (``TrustedProxies``);
- the moment the gthread worker queued the connection (``process/workers/gthread.py``),
  passed to the request's thread in a context variable. (The gevent worker
  needs no stamp: each connection has its greenlet, which reads a request as
  soon as it comes.)

"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from contextvars import ContextVar

# A context variable, not a thread-local: one value per thread, and per greenlet.
_queued_at: ContextVar[float | None] = ContextVar("serving_queued_at", default=None)


def set_queued_at(monotonic_s: float | None) -> None:
    """Called by the worker on the thread about to handle the request."""
    _queued_at.set(monotonic_s)


def queued_at() -> float | None:
    return _queued_at.get()


def from_header(value: str | None, *, now: float, wall_now: float) -> float | None:
    """The monotonic time that an ``X-Request-Start`` header stands for, or None."""
    if not value:
        return None
    text = value.strip()
    if text.startswith("t="):
        text = text[2:]
    try:
        stamp = float(text)
    except ValueError:
        return None
    if stamp > 1e14:  # microseconds
        stamp /= 1e6
    elif stamp > 1e11:  # milliseconds
        stamp /= 1e3
    waited = wall_now - stamp
    if not 0.0 <= waited < 3600.0:
        return None  # clock skew or nonsense: trust our own clock instead
    return now - waited


def arrival(header: str | None, *, now: float, wall_now: float) -> float:
    candidates = [now]
    stamped = from_header(header, now=now, wall_now=wall_now)
    if stamped is not None:
        candidates.append(stamped)
    queued = queued_at()
    if queued is not None and queued <= now:
        candidates.append(queued)
    return min(candidates)


class TrustedProxies:
    """Who may stamp ``X-Request-Start``: a client could otherwise shorten its own
    deadline's start (or, stamping the past, have every request refused as late).

    ``entries``: addresses or CIDRs (``SERVING_TRUSTED_PROXIES``), or ``*``. A peer
    with no address is a unix socket's, reachable only from the machine (the
    chart's nginx sidecar): trusted, as gunicorn's ``forwarded_allow_ips`` does.
    """

    def __init__(self, entries: Iterable[str]) -> None:
        entries = tuple(entries)
        self.anyone = "*" in entries
        networks = [ipaddress.ip_network(entry, strict=False) for entry in entries if entry != "*"]
        # One address each, the usual case: a string lookup per request.
        self._exact = {str(n.network_address) for n in networks if n.num_addresses == 1}
        self._networks = [n for n in networks if n.num_addresses > 1]

    def trusts(self, peer: str | None) -> bool:
        if self.anyone or not peer or peer in self._exact:
            return True
        if not self._networks:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self._networks)
