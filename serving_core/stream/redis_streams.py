"""Redis Streams ends: a consumer group in (``RedisSource``), XADD out (``RedisSink``);
the broker of ``redis://``, ``rediss://`` (TLS) and ``unix://`` (``stream.brokers``).

    redis://[:PASS@]HOST:PORT/DB?stream=NAME[&group=NAME][&claim_idle_ms=N]   a source
    redis://[:PASS@]HOST:PORT/DB?stream=NAME[&maxlen=N]                       a sink

An entry in: ``body`` (the params as JSON), ``id`` (optional; the entry id
otherwise), every other field a header. A result out: ``id``, ``body`` and the
headers. The group is created at id 0 with MKSTREAM on first use, so entries
added before any consumer existed are delivered too.

Where a message goes when its consumer is lost: taken, it sits in the group's
pending entries under that consumer's name until XACKed. A consumer that
reconnects reads its own pending entries first (XREADGROUP from id 0, then on
from the last it read: they stay pending until acked); one
that died (a new process has a new name) leaves them to the others, which
XAUTOCLAIM entries idle past ``claim_idle_ms`` (default a minute: longer than
a batch takes, or a live consumer's batch is run twice).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from serving_core.stream.base import Message
from serving_core.stream.redis_connection import RedisClient, check_url, text
from serving_core.stream.redis_replies import Deferred
from serving_core.stream.redis_sink import RedisSink

log = logging.getLogger("serving_core.stream.redis_streams")

DEFAULT_GROUP = "serving-core"
CLAIM_IDLE_MS = 60_000
CLAIM_EVERY_S = 5.0  # how often an otherwise idle consumer looks for a dead one's entries


def check_source(url: str) -> None:
    check_url(url, "a Redis Streams source")


def check_sink(url: str) -> None:
    check_url(url, "a Redis Streams sink")


def open_source(url: str, batch_size: int, consumer: str) -> RedisSource:
    return RedisSource(url, batch_size=batch_size, consumer=consumer)


def open_sink(url: str) -> RedisSink:
    return RedisSink(url)


class RedisSource:
    """A consumer group's member: takes entries, acks them with XACK."""

    def __init__(self, url: str, *, batch_size: int, consumer: str) -> None:
        self.redis = RedisClient(url, "a Redis Streams source")
        self.stream = self.redis.stream
        self.group = self.redis.query.get("group") or DEFAULT_GROUP
        self.claim_idle_ms = int(self.redis.query.get("claim_idle_ms") or CLAIM_IDLE_MS)
        self.batch_size = batch_size
        self.consumer = consumer
        self._ready = False  # the group exists, and our own pending entries were read
        self._history = True  # read our own pending entries before new ones
        self._history_from = "0"  # past those already read (they are pending until acked)
        self._claim_at = 0.0  # monotonic: the next XAUTOCLAIM
        self._claim_from = "0-0"  # XAUTOCLAIM's cursor
        self._acks = Deferred(self.redis.client, self.redis.call)

    def take(self, max_n: int, wait_s: float) -> list[Message]:
        return self.redis.call(lambda: self._take(max_n, wait_s))

    def _take(self, max_n: int, wait_s: float) -> list[Message]:
        client = self.redis.client
        if not self._ready:
            self._create_group()
            self._ready = True
        if self._history:
            # After a (re)connection: what this consumer took and did not ack.
            history: dict[Any, Any] = {self.stream: self._history_from}
            entries = _entries(client.xreadgroup(self.group, self.consumer, history, count=max_n))
            if entries:
                self._history_from = text(entries[-1][0])
                return self._messages(entries, redelivered=True)
            self._history = False
        if time.monotonic() >= self._claim_at:
            claimed = self._claim(max_n)
            if claimed:
                return claimed
            # Half the idle time: an entry is claimed at most 1.5 times it after it was taken.
            self._claim_at = time.monotonic() + min(CLAIM_EVERY_S, self.claim_idle_ms / 2000)
        block_ms = max(1, int(wait_s * 1000))
        read = client.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=max_n, block=block_ms
        )
        return self._messages(_entries(read), redelivered=False)

    def _create_group(self) -> None:
        import redis

        try:
            self.redis.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    def _claim(self, max_n: int) -> list[Message]:
        """Entries a dead consumer left, idle past ``claim_idle_ms``."""
        reply = self.redis.client.xautoclaim(
            self.stream,
            self.group,
            self.consumer,
            min_idle_time=self.claim_idle_ms,
            start_id=self._claim_from,
            count=max_n,
        )
        cursor, entries = reply[0], reply[1]
        self._claim_from = text(cursor)
        if self._claim_from != "0-0":
            self._claim_at = 0.0  # more to look at: the next take goes on from the cursor
        if entries:
            log.info("claimed %d entries of %r left by another consumer", len(entries), self.stream)
        return self._messages(entries, redelivered=True)

    def _messages(self, entries: list[Any], *, redelivered: bool) -> list[Message]:
        entries = [entry for entry in entries if entry[0] is not None]
        gone = [entry_id for entry_id, fields, *_ in entries if fields is None]
        if gone:  # deleted (XDEL, trimmed) while pending: nothing to run, nothing to keep
            self.redis.client.xack(self.stream, self.group, *gone)
        entries = [(entry[0], entry[1]) for entry in entries if entry[1] is not None]
        if not entries:
            return []
        counts = self._deliveries(entries) if redelivered else {}
        messages = []
        for entry_id, fields in entries:
            key = text(entry_id)
            headers = {text(k): text(v) for k, v in fields.items()}
            body = fields.get(b"body", b"")
            headers.pop("body", None)
            message_id = headers.pop("id", None) or key
            deliveries = counts.get(key, 1)
            messages.append(Message(message_id, body, headers, deliveries, key))
        return messages

    def _deliveries(self, entries: list[Any]) -> dict[str, int]:
        """Each entry's delivery count, from the group's pending entries: one XPENDING
        per entry (in one round trip), since a range from the first to the last would
        hold this consumer's other pending entries too, and its count cut some of the
        claimed ones off (read as first deliveries)."""
        pipe = self.redis.client.pipeline(transaction=False)
        for entry_id, _ in entries:
            pipe.xpending_range(
                self.stream, self.group, entry_id, entry_id, 1, consumername=self.consumer
            )
        return {
            text(p["message_id"]): int(p["times_delivered"])
            for pending in pipe.execute()
            for p in pending
        }

    def ack(self, messages: Sequence[Message]) -> None:
        """Writes the XACK and reads the previous one's reply: its fsync has long been
        done, and this one's overlaps the next batch (``redis_replies``). An XACK that
        a lost connection never delivered leaves its entries pending, to be read
        again (at-least-once)."""
        self._acks.read()
        if messages:
            ids = [str(message.tag) for message in messages]
            self._acks.write([["XACK", self.stream, self.group, *ids]])

    def lag(self) -> int | None:
        """The group's pending entries plus those not yet delivered (XINFO GROUPS)."""
        if not self._ready:  # the stream may not exist yet: the first take creates it
            return None
        self._acks.read()  # the last XACK done first: it is not counted as pending
        groups = self.redis.call(lambda: self.redis.client.xinfo_groups(self.stream))
        for group in groups:
            if text(group["name"]) == self.group:
                if group.get("lag") is None:  # Redis cannot say after some deletions
                    return None
                return int(group["pending"]) + int(group["lag"])
        return None

    def close(self) -> None:
        self._acks.close()
        self.redis.close()
        self._ready, self._history, self._history_from = False, True, "0"


def _entries(read: Any) -> list[Any]:
    """XREADGROUP's reply for one stream: its entries ([] when none came)."""
    if not read:
        return []
    if isinstance(read, dict):  # RESP3
        return list(next(iter(read.values()))[0]) if read else []
    return list(read[0][1])
