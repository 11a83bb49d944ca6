"""An open-loop HTTP load: POSTs at a fixed rate, whatever the server answers.

A closed-loop load (wrk) slows down with the server and never overloads it for
long; an open loop keeps sending on schedule, so only admission control stands
between the server and an unbounded queue. ``overload.py`` and ``storm.py``
drive the service with it.

Why our own rather than a tool: the open-loop generators that print what we
need (wrk2, vegeta, hey) are not packaged for this machine, and ``httperf``
gives no latency percentiles by status. Why asyncio protocols rather than
streams or an HTTP client library: at 10x MiniLM's capacity (~3,500
requests/s) the generator shares two cores with the server it measures. A
request costs it one ``write`` and one ``data_received`` callback, with no
task, no ``StreamReader`` and no header parsing beyond the status and
``Content-Length``: tens of microseconds, where the stream-based client it
replaces took a few hundred and fell tens of seconds behind its schedule.

Each request is one of ``bodies`` in turn, on a kept-alive connection from a
pool that grows on demand up to ``max_connections``; beyond that a request
waits for a free connection, and its latency still counts from when it was due.
A result is ``(phase, status, due_s, latency_s, sent_late_s)``: status 0 for
a failed exchange; ``due_s`` from the load's start; ``latency_s`` from when it
was due, so the generator's own lag counts against the server, never for it;
``sent_late_s`` how long after it was due it went out (that lag, reported).

    phases = [(3500.0, 30.0), (175.0, 15.0)]  # (requests/s, seconds), back to back
    results, stale = asyncio.run(run("http://127.0.0.1:8000", phases, bodies))
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

Result = tuple[int, int, float, float, float]
# (phase, status, due_s, latency_s, sent_late_s)


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection carrying one request at a time.

    A buffered protocol: the event loop reads into the pool's one buffer. A plain
    protocol's reads each allocate (and free) a 256 KiB bytes object, and that
    churn stalled the loop for 10-40 ms every second or so at 4,000 requests/s.
    """

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.done: Callable[[int], None] | None = None
        self.answered = 0  # responses on this connection so far
        self.got_bytes = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, request: bytes, done: Callable[[int], None]) -> None:
        assert self.transport is not None
        self.done, self.got_bytes = done, False
        self.transport.write(request)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.pool.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.got_bytes = True
        self.buffer += self.pool.read_buffer[:nbytes]
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        length = 0  # the server answers with a Content-Length (no chunked bodies here)
        if at >= 0:
            eol = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : eol if eol >= 0 else None])
        if len(self.buffer) < end + 4 + length:
            return
        status = int(self.buffer[9:12])
        del self.buffer[: end + 4 + length]
        done, self.done = self.done, None
        self.answered += 1
        reusable = b"\r\nconnection: close" not in head
        if reusable:
            self.pool.release(self)
        elif self.transport is not None:
            self.transport.close()
        if done is not None:
            done(status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool.lost(self)
        done, self.done = self.done, None
        if done is not None:
            # A kept-alive connection the server closed as the request went out
            # never reached the app: send it again on a new one, as HTTP clients
            # do for a stale pooled connection. Anything else failed (status 0).
            if self.answered and not self.got_bytes:
                self.pool.stale += 1
                self.pool.submit(done)
            else:
                done(0)


class _Pool:
    def __init__(
        self, host: str, port: int, request: Callable[[], bytes], max_connections: int
    ) -> None:
        self.host, self.port = host, port
        self.request = request
        self.max = max_connections
        self.idle: list[_Connection] = []
        self.open = 0
        self.waiting: list[Callable[[int], None]] = []
        self.stale = 0
        self.loop = asyncio.get_running_loop()
        # The loop reads one socket at a time, and each read is copied out at once.
        self.read_buffer = memoryview(bytearray(65536))

    def submit(self, done: Callable[[int], None]) -> None:
        if self.idle:
            self.idle.pop().send(self.request(), done)
        elif self.open < self.max:
            self.open += 1
            self.loop.create_task(self._connect(done))
        else:
            self.waiting.append(done)

    async def warm(self, count: int) -> None:
        """Open ``count`` idle connections before the clock starts: opening them on
        demand in the first milliseconds of a load stalls the loop for ~20 ms."""

        async def one() -> None:
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self), self.host, self.port
            )
            self.idle.append(conn)

        count = min(count, self.max)
        self.open += count
        await asyncio.gather(*(one() for _ in range(count)))

    async def _connect(self, done: Callable[[int], None]) -> None:
        try:
            _, conn = await self.loop.create_connection(
                lambda: _Connection(self), self.host, self.port
            )
        except OSError:
            self.open -= 1
            done(0)
            self._next()
            return
        conn.send(self.request(), done)

    def release(self, conn: _Connection) -> None:
        if self.waiting:
            conn.send(self.request(), self.waiting.pop(0))
        else:
            self.idle.append(conn)

    def lost(self, conn: _Connection) -> None:
        self.open -= 1
        if conn in self.idle:
            self.idle.remove(conn)
        self._next()

    def _next(self) -> None:
        if self.waiting and self.open < self.max:
            self.submit(self.waiting.pop(0))


async def run(
    url: str,
    phases: Sequence[tuple[float, float]],
    bodies: Sequence[bytes],
    *,
    max_connections: int = 2000,
    path: str = "/predict",
    warm_connections: int = 256,
) -> tuple[list[Result], int]:
    """Each phase's ``(rate per s, seconds)`` back to back; the results of every request
    sent, once all have been answered, and the stale connections retried."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    requests = [
        b"POST " + path.encode() + b" HTTP/1.1\r\nHost: bench\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
        for body in bodies
    ]
    counter = iter(range(1 << 62))
    pool = _Pool(host, int(port), lambda: requests[next(counter) % len(requests)], max_connections)
    await pool.warm(warm_connections)
    results: list[Result] = []
    outstanding = 0
    finished = asyncio.get_running_loop().create_future()
    sending = True

    def answer(phase: int, due: float, late: float) -> Callable[[int], None]:
        def done(status: int) -> None:
            nonlocal outstanding
            results.append((phase, status, due - start, time.monotonic() - due, late))
            outstanding -= 1
            if not outstanding and not sending and not finished.done():
                finished.set_result(None)

        return done

    start = time.monotonic() + 0.05
    offset = 0.0
    for phase, (rate, seconds) in enumerate(phases):
        count = int(rate * seconds)
        k = 0
        while k < count:
            now = time.monotonic()
            # Everything due by now goes out in this pass; a pass that runs late
            # sends its backlog at once, and each request's latency counts from
            # when it was due, so the generator's lag is never the server's credit.
            while k < count and (due := start + offset + k / rate) <= now:
                outstanding += 1
                pool.submit(answer(phase, due, now - due))
                k += 1
            if k < count:
                await asyncio.sleep(max(0.0, start + offset + k / rate - time.monotonic()))
        offset += seconds
    sending = False
    if outstanding:
        await finished
    return results, pool.stale
