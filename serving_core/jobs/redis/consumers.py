"""The Redis queue's consumers: each one's heartbeat, in a sorted set scored by its time."""

from __future__ import annotations

import time
from typing import Any

from serving_core.jobs.base import Consumers, Heartbeat
from serving_core.jobs.redis.connection import RedisConnection


class RedisConsumers:
    """Who takes from the queue: ``beat`` records a consumer, ``read`` counts the live ones.

    The key expires ``ttl_s`` after the last heartbeat.
    """

    def __init__(self, redis: RedisConnection, key: str, *, lease_s: float, ttl_s: float) -> None:
        self.redis = redis
        self.key = key
        self.ttl_s = ttl_s
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self._heartbeat = Heartbeat(lease_s)

    def beat(self, consumer: str) -> None:
        now = time.time()
        if not self._heartbeat.due(consumer, now):
            return

        def record() -> None:
            pipe = self.redis.client.pipeline(transaction=False)
            pipe.zadd(self.key, {consumer: now})
            # Consumer names are host-pid: each restart adds one, so forget old ones.
            pipe.zremrangebyscore(self.key, "-inf", now - self.ttl_s)
            pipe.pexpire(self.key, self.ttl_ms)
            pipe.execute()

        self.redis.call(record)

    def read(self, within_s: float) -> Consumers:
        def read() -> list[Any]:
            pipe = self.redis.client.pipeline(transaction=False)
            pipe.zcount(self.key, time.time() - within_s, "+inf")
            pipe.zrevrange(self.key, 0, 0, withscores=True)
            return pipe.execute()

        live, latest = self.redis.call(read)
        return Consumers(int(live), float(latest[0][1]) if latest else None)
