"""The payload log never holds up a request: a full queue drops and counts, a failing
sink counts its events failed and is opened again, and a worker's exit sends what is
queued without waiting on a dead sink."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from serving_core.context import Context, serving
from serving_core.errors import InvalidParams
from serving_core.payloads.logger import PayloadLog
from serving_core.payloads.sampler import Sampler
from serving_core.payloads.sinks import Encoded, SinkFailed
from tests.payloads.recorder import ORIGIN, Counts, HeldSink
from tests.servers import wait_for

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def payload_log(sink_for, counts, *, rate=1.0, queue_size=1000):
    return PayloadLog(
        "redis://:hunter2@127.0.0.1:1/0?stream=payloads",
        origin=ORIGIN,
        sampler=Sampler(rate),
        queue_size=queue_size,
        observer=counts,
        open_sink=sink_for,
    )


def bodies(sink):
    return [orjson.loads(body) for _, body in sink.received]


def test_a_full_queue_drops_the_event_and_counts_it_instead_of_waiting():
    sink, counts = HeldSink(), Counts()
    sink.open_.clear()  # the sink takes nothing until the test says
    log = payload_log(lambda url: sink, counts, queue_size=2)
    log.start()
    try:
        assert log.offer("r1", {"n": 1}, {"ok": True})
        assert sink.entered.wait(10)  # r1 is in the sender's hands, held there
        assert log.offer("r2", {"n": 2}, {"ok": True})
        assert log.offer("r3", {"n": 3}, {"ok": True})
        assert not log.offer("r4", {"n": 4}, {"ok": True})  # full: returns, dropped
        assert counts["dropped"] == 1
        sink.open_.set()
        wait_for(lambda: counts["sent"] == 3, "the three queued events sent")
    finally:
        log.stop()
    assert [event["requestid"] for event in bodies(sink)] == ["r1", "r2", "r3"]
    assert counts.counts == {"sent": 3, "dropped": 1}


def test_only_the_sampled_exchanges_and_every_error_are_queued():
    sink, counts = HeldSink(), Counts()
    log = payload_log(lambda url: sink, counts, rate=0.0)
    log.start()
    try:
        assert not log.offer("answered", {"n": 1}, {"ok": True})
        assert log.offer("failed", {"n": 2}, error=InvalidParams("no"))
        wait_for(lambda: counts["sent"] == 1, "the error's event sent")
    finally:
        log.stop()
    [only] = bodies(sink)
    assert only["requestid"] == "failed"
    assert only["data"]["error"] == {"status": 400, "message": "no"}


def test_a_sink_that_fails_counts_its_events_failed_and_is_opened_again():
    counts, opened = Counts(), []
    sink = HeldSink()

    def sink_for(url):
        opened.append(url)
        if len(opened) == 1:
            raise ConnectionRefusedError("nothing listens there")
        return sink

    log = payload_log(sink_for, counts)
    log.start()
    try:
        assert log.offer("lost", {"n": 1}, {"ok": True})  # never raises into the request
        wait_for(lambda: counts["failed"] == 1, "the first event failed")
        assert log.offer("after", {"n": 2}, {"ok": True})
        wait_for(lambda: counts["sent"] == 1, "the next event sent after the back-off")
    finally:
        log.stop()
    assert [event["requestid"] for event in bodies(sink)] == ["after"]
    assert len(opened) == 2


def test_a_sink_that_took_part_of_a_batch_counts_the_rest_failed():
    counts = Counts()

    class Half:
        def send(self, events: Sequence[Encoded]) -> None:
            raise SinkFailed("took the first only", sent=1)

        def close(self) -> None:
            pass

    log = payload_log(lambda url: Half(), counts)
    for n in range(3):  # queued before the sender starts: one batch
        log.offer(f"r{n}", {"n": n}, {"ok": True})
    log.start()
    log.stop()
    assert counts.counts == {"sent": 1, "failed": 2}


def test_an_answer_json_cannot_hold_fails_alone():
    sink, counts = HeldSink(), Counts()
    log = payload_log(lambda url: sink, counts)
    log.offer("odd", {"n": 1}, {"value": object()})
    log.offer("fine", {"n": 2}, {"value": 1})
    log.start()
    log.stop()
    assert counts.counts == {"sent": 1, "failed": 1}
    assert [event["requestid"] for event in bodies(sink)] == ["fine"]


def test_stop_sends_what_is_queued_then_closes_the_sink():
    sink, counts = HeldSink(), Counts()
    log = payload_log(lambda url: sink, counts)
    for n in range(150):  # more than one batch
        log.offer(f"r{n}", {"n": n}, {"ok": True})
    log.start()
    log.stop()
    assert counts.counts == {"sent": 150}
    assert len(sink.received) == 150
    assert sink.closed == 1


def test_stop_with_a_dead_sink_returns_and_counts_every_event():
    counts = Counts()

    def dead(url):
        raise ConnectionRefusedError("gone")

    log = payload_log(dead, counts)
    for n in range(200):
        log.offer(f"r{n}", {"n": n}, {"ok": True})
    log.start()
    log.stop(timeout_s=30)
    assert counts["failed"] >= 1
    assert counts["failed"] + counts["dropped"] == 200


def test_a_log_never_started_counts_its_queue_dropped_at_stop():
    counts = Counts()
    log = payload_log(lambda url: HeldSink(), counts)
    log.offer("r1", {"n": 1}, {"ok": True})
    log.stop()
    assert counts.counts == {"dropped": 1}


def test_the_event_carries_the_requests_traceparent():
    sink, counts = HeldSink(), Counts()
    log = payload_log(lambda url: sink, counts)
    with serving(Context("traced", traceparent=TRACEPARENT)):
        log.offer("traced", {"n": 1}, {"ok": True})
    log.offer("untraced", {"n": 2}, {"ok": True})
    log.start()
    log.stop()
    traced, untraced = bodies(sink)
    assert traced["traceparent"] == TRACEPARENT
    assert "traceparent" not in untraced


def test_an_outage_is_logged_once_with_the_url_masked(caplog):
    counts = Counts()

    def dead(url):
        raise ConnectionRefusedError(f"cannot reach {url}")

    log = payload_log(dead, counts)
    log.start()
    try:
        for n in range(3):
            log.offer(f"r{n}", {"n": n}, {"ok": True})
            wait_for(lambda n=n: counts["failed"] == n + 1, f"event {n} failed")
    finally:
        log.stop()
    warnings = [r.getMessage() for r in caplog.records if r.name == "serving_core.payloads"]
    failed = [line for line in warnings if "failed" in line]
    assert len(failed) == 1, warnings
    assert "hunter2" not in caplog.text
    assert "redis://:***@127.0.0.1:1/0" in failed[0]
