"""An HTTP endpoint as the sink: each event POSTed as ``application/cloudevents+json``
(CloudEvents' HTTP binding, structured mode), with urllib3.

A ``2xx`` is taken; any other status, a refused connection or a timeout fails the
event. A URL's ``user:password@`` is sent as basic authentication, never logged.
"""

from __future__ import annotations

from collections.abc import Sequence

import urllib3
from urllib3.exceptions import LocationParseError
from urllib3.util import make_headers, parse_url

from serving_core.payloads.event import CONTENT_TYPE
from serving_core.payloads.sinks import VARIABLE, Encoded, SinkFailed
from serving_core.settings.secrets import masked

# Short: a slow endpoint holds up only the events behind it, which the bounded queue
# drops and counts, but a worker's exit waits for the one in flight.
TIMEOUT = urllib3.Timeout(connect=2.0, read=5.0)


def check(url: str) -> None:
    try:
        parsed = parse_url(url)
    except LocationParseError:
        parsed = None
    if parsed is None or not parsed.host:
        raise ValueError(
            f"{VARIABLE}={masked(url)!r} names no host; use e.g. http://collector:8080/events"
        )


def open_sink(url: str) -> HttpSink:
    return HttpSink(url)


class HttpSink:
    def __init__(self, url: str) -> None:
        parsed = parse_url(url)
        self.headers = {"content-type": CONTENT_TYPE}
        if parsed.auth:
            self.headers.update(make_headers(basic_auth=parsed.auth))
        self.url = parsed._replace(auth=None).url
        self._pool = urllib3.PoolManager(timeout=TIMEOUT, retries=False)

    def send(self, events: Sequence[Encoded]) -> None:
        for sent, (_, body) in enumerate(events):
            try:
                response = self._pool.request("POST", self.url, body=body, headers=self.headers)
            except urllib3.exceptions.HTTPError as error:
                raise SinkFailed(f"{masked(self.url)}: {error}", sent) from None
            if not 200 <= response.status < 300:
                raise SinkFailed(f"{masked(self.url)} answered {response.status}", sent)

    def close(self) -> None:
        self._pool.clear()
