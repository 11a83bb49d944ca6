"""The Redis Streams ends on a real redis-server: the group, pending entries, claims, lag."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
import redis

from serving_core.stream.base import BrokerError, Outgoing
from serving_core.stream.brokers import open_sink, open_source
from serving_core.stream.redis_streams import RedisSink, RedisSource
from tests.redis_server import redis_server
from tests.servers import SERVING_CORE, base_env, wait_for


@pytest.fixture
def url() -> Iterator[str]:
    with redis_server() as running:
        yield running


def produce(url: str, count: int) -> None:
    client = redis.Redis.from_url(url)
    for i in range(count):
        client.xadd("in", {"body": json.dumps({"n": i}), "id": f"m-{i}", "trace": f"t-{i}"})
    client.close()


@pytest.mark.e2e
def test_a_source_reads_body_id_and_headers_and_counts_its_lag(url: str) -> None:
    produce(url, 5)
    source = open_source(f"{url}?stream=in", 3, "a")
    assert isinstance(source, RedisSource)
    taken = source.take(3, 0.1)
    assert [(m.id, json.loads(m.body), m.headers, m.deliveries) for m in taken] == [
        (f"m-{i}", {"n": i}, {"trace": f"t-{i}"}, 1) for i in range(3)
    ]
    assert source.lag() == 5  # 3 pending, 2 not yet delivered
    source.ack(taken[:2])
    assert source.lag() == 3
    source.ack(taken[2:])  # its reply is read at close: a stop's last ack is done
    source.close()
    client = redis.Redis.from_url(url)
    assert client.xpending("in", "serving-core")["pending"] == 0
    client.close()


@pytest.mark.e2e
def test_a_reconnected_consumer_reads_its_own_pending_entries_first(url: str) -> None:
    produce(url, 4)
    source = RedisSource(f"{url}?stream=in", batch_size=2, consumer="a")
    first = source.take(2, 0.1)
    source.close()  # as after a lost connection: nothing was acked
    again = source.take(2, 0.1)
    assert [m.id for m in again] == [m.id for m in first]
    assert all(m.deliveries == 2 for m in again)
    source.ack(again)
    assert [m.id for m in source.take(2, 0.1)] == ["m-2", "m-3"]


@pytest.mark.e2e
def test_a_dead_consumers_entries_are_claimed_once_idle(url: str) -> None:
    produce(url, 3)
    query = f"{url}?stream=in&group=g&claim_idle_ms=200"
    dead = RedisSource(query, batch_size=3, consumer="dead")
    assert len(dead.take(3, 0.1)) == 3
    live = RedisSource(query, batch_size=3, consumer="live")
    claimed = wait_for(lambda: live.take(3, 0.05), "the dead consumer's entries claimed")
    assert [(m.id, m.deliveries) for m in claimed] == [(f"m-{i}", 2) for i in range(3)]
    live.ack(claimed)
    assert live.lag() == 0


@pytest.mark.e2e
def test_a_sink_adds_id_body_and_headers_and_trims_to_maxlen(url: str) -> None:
    sink = open_sink(f"{url}?stream=out&maxlen=10")
    assert isinstance(sink, RedisSink)
    sink.publish([Outgoing(f"m-{i}", b'{"ok": 1}', {"trace": "t"}) for i in range(500)])
    client = redis.Redis.from_url(url)
    entries = client.xrange("out")
    assert entries[-1][1] == {b"trace": b"t", b"id": b"m-499", b"body": b'{"ok": 1}'}
    assert len(entries) < 500  # MAXLEN ~ trims whole nodes: near 10, never exactly
    client.close()


@pytest.mark.e2e
def test_sent_results_are_stored_once_confirmed_and_a_refusal_is_a_broker_error(
    url: str,
) -> None:
    sink = RedisSink(f"{url}?stream=out")
    client = redis.Redis.from_url(url)
    try:
        sink.send([Outgoing("a", b"{}"), Outgoing("b", b"{}")])
        sink.send([Outgoing("c", b"{}")])  # a second batch before the first is confirmed
        sink.confirm()
        assert [e[1][b"id"] for e in client.xrange("out")] == [b"a", b"b", b"c"]
        sink.confirm()  # nothing left to wait for
        # A key of another type: Redis refuses the XADD, and the confirm says so.
        client.set("out", "not a stream")
        sink.send([Outgoing("d", b"{}")])
        with pytest.raises(BrokerError, match="WRONGTYPE"):
            sink.confirm()
        client.delete("out")
        sink.publish([Outgoing("e", b"{}")])  # a new connection, no stale replies on it
        assert [e[1][b"id"] for e in client.xrange("out")] == [b"e"]
    finally:
        sink.close()
        client.close()


@pytest.mark.e2e
def test_a_lost_redis_is_a_broker_error() -> None:
    with redis_server() as gone:
        pass
    with pytest.raises(BrokerError, match="stream 'in'"):
        RedisSource(f"{gone}?stream=in", batch_size=1, consumer="a").take(1, 0.1)
    with pytest.raises(BrokerError):
        RedisSink(f"{gone}?stream=out").publish([Outgoing("m", b"{}")])


def test_an_unknown_scheme_names_the_setting() -> None:
    with pytest.raises(ValueError, match="SERVING_STREAM_DEAD_LETTER"):
        open_sink("nats://broker:4222?subject=x", "SERVING_STREAM_DEAD_LETTER")


def test_the_stream_command_refuses_to_start_without_its_ends() -> None:
    ran = subprocess.run(
        [str(SERVING_CORE), "stream"],
        env=base_env({"SERVING_STREAM_SOURCE": "redis://127.0.0.1:1/0?stream=in"}),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert ran.returncode != 0
    assert "SERVING_STREAM_SINK is not set" in ran.stderr


@pytest.mark.e2e
def test_i4_claimed_entries_read_their_delivery_counts_past_the_consumers_own_pending(
    url: str,
) -> None:
    """I4: a claim's delivery counts were read with one XPENDING over the range from its
    first entry to its last, cut at as many entries as were claimed: this consumer's own
    pending entries inside that range pushed claimed ones out, read as first deliveries."""
    produce(url, 6)
    client = redis.Redis.from_url(url)
    client.xgroup_create("in", "serving-core", id="0")
    source = RedisSource(f"{url}?stream=in", batch_size=1, consumer="a")
    dead: list[bytes] = []
    for _ in range(3):  # taken in turns: a dead consumer's, then this one's, ...
        ((_, entries),) = client.xreadgroup("serving-core", "dead", {"in": ">"}, count=1)
        dead.append(entries[0][0])
        assert len(source.take(1, 0.1)) == 1  # held: pending under "a"
    # The dead consumer's entries idle long, run three times (a claim makes it four).
    client.xclaim("in", "serving-core", "dead", 0, dead, idle=600_000, retrycount=3)
    # Its claims come every few seconds: the takes until one (an event, bounded).
    claimed = wait_for(lambda: source.take(3, 0.1), "the claim", 30)
    assert [m.tag for m in claimed] == [entry_id.decode() for entry_id in dead]
    assert [m.deliveries for m in claimed] == [4, 4, 4]
    source.close()
    client.close()


@pytest.mark.e2e
def test_a_reconnected_consumers_own_pending_entries_are_read_once_not_at_every_take(
    url: str,
) -> None:
    """After a reconnection, the consumer's pending entries are read from where the last
    read of them ended: they stay pending until acked, and a take while a batch awaits
    its ack would otherwise hand the same entries out again."""
    produce(url, 4)
    source = RedisSource(f"{url}?stream=in", batch_size=2, consumer="a")
    source.take(4, 0.1)
    source.close()  # as after a lost connection: nothing was acked
    first = source.take(2, 0.1)
    second = source.take(2, 0.1)
    assert [m.id for m in first + second] == ["m-0", "m-1", "m-2", "m-3"]
    assert source.take(2, 0.1) == []
    source.close()


@pytest.mark.e2e
def test_an_entry_without_a_body_field_is_handed_out_with_an_empty_body(url: str) -> None:
    """New user's walk: its dead letter said "the message body is not JSON"; the loop now
    says what is missing (tests/loops/test_stream.py)."""
    client = redis.Redis.from_url(url)
    client.xadd("in", {"id": "m-0", "params": '{"n": 1}'})
    client.close()
    source = RedisSource(f"{url}?stream=in", batch_size=2, consumer="a")
    (taken,) = source.take(2, 0.1)
    assert (taken.id, taken.body, taken.headers) == ("m-0", b"", {"params": '{"n": 1}'})
    source.close()


@pytest.mark.e2e
def test_a_unix_socket_url_reaches_redis(tmp_path):
    """``unix:///path?stream=NAME`` (redis-py's form for a socket) connects: the stream
    key was taken out of the query, and the path kept its ``//`` (it became
    ``unix:/path``, which redis-py refuses)."""
    from serving_core.stream.redis_connection import RedisClient, split_url

    assert split_url("unix:///run/r.sock?stream=in&db=2") == (
        "unix:///run/r.sock?db=2",
        {"stream": "in"},
    )
    sock = tmp_path / "redis.sock"
    with redis_server(options=["--unixsocket", str(sock), "--unixsocketperm", "700"]):
        client = RedisClient(f"unix://{sock}?stream=in", "SERVING_STREAM_SOURCE")
        assert client.call(client.client.ping) is True
