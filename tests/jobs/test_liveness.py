"""A queue with no live consumer is visible: the heartbeats consumers leave in the store,
read back on both backends (SQLite and a real Redis), as a hint and as gauges."""

from __future__ import annotations

import logging
import math
import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving_core.jobs import liveness
from serving_core.jobs.base import Consumers, Heartbeat
from serving_core.settings import Settings
from tests.jobs.conftest import POLL_TIMEOUT_S, MakeQueue
from tests.servers import wait_for


def test_a_queue_nobody_has_taken_from_has_no_consumer(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.submit({"text": "waits"})
    assert queue.consumers(60) == Consumers(live=0, last_seen=None)


def test_each_consumer_that_takes_is_counted_by_every_process_sharing_the_queue(
    make_queue: MakeQueue,
) -> None:
    first, second, api = make_queue(), make_queue(), make_queue()
    before = time.time()
    first.take("host-1", 1, 0)
    first.take("host-1", 1, 0)  # the same consumer again is still one
    second.take("host-2", 1, 0)
    seen = api.consumers(60)
    assert seen.live == 2
    assert seen.last_seen is not None
    assert before <= seen.last_seen <= time.time()


def test_a_consumer_only_renewing_a_long_batch_is_live_too(make_queue: MakeQueue) -> None:
    queue, busy = make_queue(), make_queue()
    queue.submit({"text": "slow"})
    jobs = queue.take("host-1", 1, 0)
    busy.renew("host-2", jobs)  # host-2 never took: only its renewal says it is alive
    assert queue.consumers(60).live == 2


def test_a_quiet_consumer_leaves_the_window_and_is_forgotten_after_the_ttl(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue(jobs_ttl_s=0.3)
    queue.take("gone", 1, 0)
    took = queue.consumers(60).last_seen
    assert took is not None
    # Outside a short window it no longer counts, though its heartbeat is kept.
    wait_for(
        lambda: queue.consumers(0.05).live == 0, "the heartbeat to age", timeout_s=POLL_TIMEOUT_S
    )
    assert queue.consumers(0.05).last_seen == took
    # Once it is older than the TTL, the next consumer's heartbeat deletes it.
    wait_for(lambda: time.time() > took + 0.3, "the TTL to pass", timeout_s=POLL_TIMEOUT_S)
    queue.take("new", 1, 0)
    seen = queue.consumers(3600)
    assert seen.live == 1
    assert seen.last_seen is not None
    assert seen.last_seen > took


def test_a_consumer_records_its_heartbeat_at_most_every_few_seconds() -> None:
    beat = Heartbeat(lease_s=60)
    assert beat.every_s == 5
    assert beat.due("a", 100.0)
    assert not beat.due("a", 104.9)
    assert beat.due("b", 104.9)  # each consumer its own
    assert beat.due("a", 105.0)
    # Several beats per lease, however short it is set.
    assert Heartbeat(lease_s=0.3).every_s == pytest.approx(0.1)


def test_the_hint_says_which_worker_to_start_until_one_polls(
    make_queue: MakeQueue, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue()
    settings = Settings(jobs_path="/tmp/q.db")
    with caplog.at_level(logging.INFO, logger="serving_core.jobs.liveness"):
        text = liveness.hint(queue, settings, handler="handlers/sentiment")
    assert text is not None
    assert f"no serving-core worker has taken jobs from queue {queue.queue!r}," in text
    assert "this server's SERVING_HANDLER and SERVING_JOBS_PATH" in text
    # The paths are the operator's: in the log, never in what the client reads.
    assert "handlers/sentiment" not in text
    assert "/tmp/q.db" not in text
    assert "SERVING_HANDLER=handlers/sentiment" in caplog.text
    assert "SERVING_JOBS_PATH=/tmp/q.db" in caplog.text
    redis = liveness.hint(queue, Settings(jobs_url="redis://secret@db:6379/0"), handler=None)
    assert redis is not None
    assert "this server's SERVING_HANDLER and SERVING_JOBS_URL" in redis
    assert "secret" not in redis  # a URL may hold a password: it is never echoed
    assert "secret" not in caplog.text
    queue.take("host-1", 1, 0)
    assert liveness.hint(queue, settings, handler="handlers/sentiment") is None


def test_the_hint_says_how_long_the_queue_has_been_unpolled(make_queue: MakeQueue) -> None:
    queue = make_queue()
    queue.take("gone", 1, 0)
    settings = Settings(jobs_lease_s=0.05)
    wait_for(
        lambda: liveness.hint(queue, settings, handler=None),
        "the consumer to count as gone",
        timeout_s=POLL_TIMEOUT_S,
    )
    text = liveness.hint(queue, settings, handler=None)
    assert text is not None
    assert re.search(f"has taken jobs from queue {queue.queue!r} for [0-9]+ s, so this job", text)


def test_the_gauges_name_each_queue_with_its_consumers_age_and_depth(
    make_queue: MakeQueue,
) -> None:
    api, worker = make_queue(), make_queue()  # one queue, seen from two processes
    worker.take("host-1", 1, 0)  # nothing to take yet, but it polled
    api.submit({"n": 1})
    text = liveness.exposition([api], 60).decode()
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels == {"queue": api.queue}
    }
    assert values["serving_job_consumers"] == 1
    assert 0 <= values["serving_job_queue_unpolled_seconds"] < 60
    assert values["serving_job_queue_depth"] == 1
    assert liveness.exposition([], 60) == b""


def test_a_queue_never_polled_is_unpolled_for_ever(make_queue: MakeQueue) -> None:
    queue = make_queue()
    text = liveness.exposition([queue], 60).decode()
    line = f'serving_job_queue_unpolled_seconds{{queue="{queue.queue}"}} '
    [value] = [row[len(line) :] for row in text.splitlines() if row.startswith(line)]
    assert math.isinf(float(value))
    assert f'serving_job_consumers{{queue="{queue.queue}"}} 0.0' in text
