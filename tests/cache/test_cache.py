from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest

from serving_core import encoding
from serving_core.cache.cache import Cache, from_settings
from serving_core.cache.key import PREFIX, key
from serving_core.cache.memorystore import MemoryStore
from serving_core.cache.redisstore import RedisStore
from serving_core.cache.store import StoreError
from serving_core.errors import DeadlineExceeded, ModelError, Overloaded
from serving_core.handler import Handler
from serving_core.metrics.metrics import Metrics
from serving_core.settings import Settings
from tests.redis_server import redis_server
from tests.servers import ROOT
from tests.test_metrics import sample

WAIT_S = 30.0  # a bound on waiting for an event, never a budget


class Recorder:
    def __init__(self) -> None:
        self.results: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.coalesced = threading.Semaphore(0)

    def cache_request(self, result: str) -> None:
        self.results[result] += 1
        if result == "coalesced":
            self.coalesced.release()

    def cache_error(self, store: str) -> None:
        self.errors[store] += 1

    def wait_coalesced(self, count: int) -> None:
        for _ in range(count):
            assert self.coalesced.acquire(timeout=WAIT_S), "waiters never arrived"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def memory_cache(observer=None, version="1", **kwargs):
    return Cache(MemoryStore(100, 60.0), "model", version, observer, **kwargs)


# -- keys -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"x": 1, "y": 2}, {"y": 2, "x": 1}),
        ({"x": 1}, {"x": 1.0}),
        ({"x": 0}, {"x": -0.0}),
        ({"x": 2**64}, {"x": float(2**64)}),
        ({"x": [1, 2]}, {"x": (1, 2)}),
        ({"b": [1, {"d": 1, "c": 2}], "a": None}, {"a": None, "b": [1, {"c": 2, "d": 1.0}]}),
        ({"f": b"\x89PNG"}, {"f": bytearray(b"\x89PNG")}),
        ({"x": np.int64(3)}, {"x": 3}),
        ({"x": np.float32(0.5)}, {"x": 0.5}),
        ({"x": np.bool_(True)}, {"x": True}),
    ],
)  # fmt: skip
def test_requests_a_json_client_calls_the_same_share_a_key(a, b):
    assert key("m", "1", a) == key("m", "1", b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"x": True}, {"x": 1}),
        ({"x": False}, {"x": 0}),
        ({"x": 0.1}, {"x": 0.10000000000000002}),
        ({"x": "1"}, {"x": 1}),
        ({"x": "ab"}, {"x": b"ab"}),
        ({"f": b"a"}, {"f": b"b"}),
        ({"x": None}, {}),
        ({"x": []}, {"x": {}}),
        ({"x": [[1], 2]}, {"x": [1, [2]]}),
        ({"x": ["a", "b"]}, {"x": ["ab"]}),
        ({"ab": "c"}, {"a": "bc"}),
        ({"x": float("nan")}, {"x": float("inf")}),
    ],
)
def test_different_requests_have_different_keys(a, b):
    assert key("m", "1", a) != key("m", "1", b)


def test_a_key_names_the_handler_and_its_version_and_has_a_fixed_length():
    short = key("minilm", "2", {"text": "a"})
    long = key("minilm", "2", {"text": "a" * 100_000, "file": b"\0" * 100_000})
    assert short.startswith(f"{PREFIX}minilm:2:")
    assert len(short) == len(long) == len(f"{PREFIX}minilm:2:") + 32
    assert key("minilm", "3", {"text": "a"}) != short
    # The name and version are hashed too: a colon in either cannot make two collide.
    assert key("a:b", "c", {}) != key("a", "b:c", {})


@pytest.mark.parametrize("bad", [{1, 2}, object(), {1: "a"}, [complex(1, 2)]])
def test_values_with_no_canonical_form_raise_a_type_error(bad):
    with pytest.raises(TypeError, match="cannot make a cache key"):
        key("m", "1", {"x": bad})


def test_uncacheable_parameters_have_no_key_and_are_not_counted():
    observer = Recorder()
    cache = memory_cache(observer)
    assert cache.lookup({"x": {1, 2}}) == (None, None)
    assert cache.key_for({"x": object()}) is None
    assert not observer.results


# -- the memory store ---------------------------------------------------------------


def test_the_memory_store_evicts_the_least_recently_used_entry():
    store = MemoryStore(2, 60.0, clock=Clock())
    store.set("a", b"1")
    store.set("b", b"2")
    assert store.get("a") == b"1"  # now b is the least recently used
    store.set("c", b"3")
    assert store.get("b") is None
    assert store.get("a") == b"1"
    assert store.get("c") == b"3"
    assert len(store) == 2


def test_memory_entries_expire_after_their_ttl():
    clock = Clock()
    store = MemoryStore(10, 5.0, clock=clock)
    store.set("a", b"1")
    clock.now += 4.999
    assert store.get("a") == b"1"
    clock.now += 0.001
    assert store.get("a") is None
    assert len(store) == 0
    store.set("a", b"2")  # a fresh set starts a fresh ttl
    clock.now += 4.0
    assert store.get("a") == b"2"


# -- the cache over memory ----------------------------------------------------------


def numpy_output():
    rng = np.random.default_rng(0)
    scale = np.float32(10) ** rng.integers(-30, 30, 10_000).astype(np.float32)
    return {
        # float32 prints in its own shortest form, some of which float64 prints
        # differently (0.0000021732194 vs 2.1732194e-6): the cache must not show it.
        "embedding": rng.standard_normal(10_000).astype(np.float32) * scale,
        "ids": np.arange(5, dtype=np.int64),
        "score": np.float32(0.1),
        "label": "ok",
        "nested": {"nan": float("nan"), "values": [1, 2.5, None, True]},
    }


def test_a_fill_makes_the_next_lookup_a_hit_with_the_same_json_body():
    observer = Recorder()
    cache = memory_cache(observer)
    output = numpy_output()
    params = {"text": "hello"}
    key_, found = cache.lookup(params)
    assert found is None
    miss = cache.fill(key_, output)
    again, hit = cache.lookup(params)
    assert again == key_
    assert encoding.dumps(hit) == encoding.dumps(miss)
    assert encoding.loads(encoding.dumps(hit)) == encoding.loads(encoding.dumps(output))
    assert observer.results == {"miss": 1, "hit": 1}


def test_a_miss_and_a_hit_of_single_flight_have_the_same_json_body():
    cache = memory_cache()
    key_ = cache.key_for({"text": "hello"})
    miss, result = cache.single_flight(key_, numpy_output)
    assert result == "miss"
    hit, result = cache.single_flight(key_, pytest.fail)
    assert result == "hit"
    assert encoding.dumps(hit) == encoding.dumps(miss)


def test_a_changed_version_misses():
    store = MemoryStore(10, 60.0)
    old = Cache(store, "model", "1")
    key_, _ = old.lookup({"x": 1})
    old.fill(key_, {"y": 2})
    assert Cache(store, "model", "2").lookup({"x": 1})[1] is None
    assert old.lookup({"x": 1.0})[1] == {"y": 2}


def test_single_flight_hits_after_a_miss_fills():
    observer = Recorder()
    cache = memory_cache(observer)
    key_ = cache.key_for({"x": 1})
    assert cache.single_flight(key_, lambda: {"y": 1}) == ({"y": 1}, "miss")
    assert cache.single_flight(key_, pytest.fail) == ({"y": 1}, "hit")
    assert observer.results == {"miss": 1, "hit": 1}


def concurrent_calls(cache, observer, key_, compute, n=16):
    """``n`` threads call single_flight at once; compute runs once all the others wait."""
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(cache.single_flight, key_, compute) for _ in range(n)]
        return [f.exception(WAIT_S) or f.result() for f in futures]


def test_sixteen_concurrent_identical_misses_compute_once():
    observer = Recorder()
    cache = memory_cache(observer)
    calls = []

    def compute():
        calls.append(1)
        observer.wait_coalesced(15)
        return {"y": np.float32(1.5)}

    results = concurrent_calls(cache, observer, cache.key_for({"x": 1}), compute)
    assert len(calls) == 1
    assert sorted(r for _, r in results) == ["coalesced"] * 15 + ["miss"]
    assert all(encoding.dumps(o) == b'{"y":1.5}' for o, _ in results)


def test_a_failing_compute_raises_the_same_error_in_every_waiter_and_is_not_cached():
    observer = Recorder()
    cache = memory_cache(observer)
    error = ValueError("model broke")

    def compute():
        observer.wait_coalesced(7)
        raise error

    key_ = cache.key_for({"x": 1})
    results = concurrent_calls(cache, observer, key_, compute, n=8)
    assert results == [error] * 8
    assert cache.single_flight(key_, lambda: {"y": 2}) == ({"y": 2}, "miss")


@pytest.mark.parametrize(
    "own",
    [
        DeadlineExceeded("the leader's X-Request-Timeout ran out"),
        Overloaded("the queue was full when the leader came", reason="full", retry_after_s=1),
        KeyboardInterrupt(),  # a cancelled leader: its client left, its worker stops
    ],
)
def test_a_leaders_own_failure_is_not_handed_to_the_waiters_which_compute_again(own):
    observer = Recorder()
    cache = memory_cache(observer)
    calls = []

    def compute():
        calls.append(1)
        if len(calls) == 1:
            observer.wait_coalesced(3)
            raise own
        return {"y": 1}

    results = concurrent_calls(cache, observer, cache.key_for({"x": 1}), compute, n=4)
    assert results.count(own) == 1
    answers = [r for r in results if r is not own]
    assert [output for output, _ in answers] == [{"y": 1}] * 3
    # One waiter led the second call; the others waited for it (or came after: a hit).
    assert sorted(served for _, served in answers)[-1] == "miss"
    assert len(calls) == 2


def test_a_model_error_is_shared_with_the_waiters():
    observer = Recorder()
    cache = memory_cache(observer)
    error = ModelError("the handler failed on these parameters")

    def compute():
        observer.wait_coalesced(3)
        raise error

    assert concurrent_calls(cache, observer, cache.key_for({"x": 1}), compute, n=4) == [error] * 4


def test_the_model_build_and_the_caller_are_part_of_the_key():
    store = MemoryStore(10, 60.0)
    old = Cache(store, "model", "1", revision="sha-old")
    key_, _ = old.lookup({"x": 1}, caller="alice")
    old.fill(key_, {"y": 2})
    assert old.lookup({"x": 1}, caller="alice")[1] == {"y": 2}
    assert old.lookup({"x": 1}, caller="bob")[1] is None
    assert old.lookup({"x": 1})[1] is None  # no caller: the shared entries
    assert Cache(store, "model", "1", revision="sha-new").lookup({"x": 1}, "alice")[1] is None
    revised = from_settings(Settings(model_revision="sha-new"), Model())
    assert revised.revision == "sha-new"
    assert revised.key_for({"x": 1}) != from_settings(Settings(), Model()).key_for({"x": 1})


def test_the_fetched_artifacts_revision_is_part_of_the_key():
    fetched = Model()
    fetched.artifacts_revision = "sha256:0123"
    keyed = from_settings(Settings(model_revision="sha-build"), fetched)
    assert keyed.revision == "sha-build+sha256:0123"
    refetched = Model()
    refetched.artifacts_revision = "sha256:4567"
    assert keyed.key_for({"x": 1}) != from_settings(
        Settings(model_revision="sha-build"), refetched
    ).key_for({"x": 1})
    assert from_settings(Settings(), fetched).revision == "sha256:0123"


def test_waiters_use_the_injected_future_and_a_lone_request_makes_none():
    made = []

    class Recorded(Future):
        def __init__(self):
            super().__init__()
            made.append(self)

    observer = Recorder()
    cache = memory_cache(observer, new_future=Recorded)
    cache.single_flight(cache.key_for({}), dict)
    assert made == []  # nobody waited for it

    def compute():
        observer.wait_coalesced(3)
        return {"y": 1}

    results = concurrent_calls(cache, observer, cache.key_for({"x": 1}), compute, n=4)
    assert [output for output, _ in results] == [{"y": 1}] * 4
    assert len(made) == 1  # one future, shared by the three waiters


def test_unserialisable_outputs_are_returned_but_not_cached():
    cache = memory_cache()
    key_ = cache.key_for({})
    output = {"x": object()}
    assert cache.single_flight(key_, lambda: output) == (output, "miss")
    assert len(cache.store) == 0


def test_a_corrupt_entry_is_a_miss_and_an_error():
    observer = Recorder()
    cache = memory_cache(observer)
    key_ = cache.key_for({})
    cache.store.set(key_, b"[1, 2")
    assert cache.lookup({})[1] is None
    assert observer.errors == {"memory": 1}


def test_the_metrics_count_cache_results_and_errors():
    metrics = Metrics()
    cache = memory_cache(metrics)
    key_, _ = cache.lookup({})
    cache.fill(key_, {})
    cache.lookup({})
    metrics.cache_error("redis")
    text = metrics.exposition().decode()
    assert sample(text, "serving_cache_requests_total", result="hit") == 1
    assert sample(text, "serving_cache_requests_total", result="miss") == 1
    assert sample(text, "serving_cache_requests_total", result="coalesced") == 0
    assert sample(text, "serving_cache_errors_total", store="redis") == 1


# -- from_settings ---------------------------------------------------------------------


class Model(Handler):
    name = "model"
    version = "7"


class Sampler(Handler):
    cacheable = False


def test_from_settings_builds_the_configured_cache_or_none():
    memory = from_settings(Settings(cache_size=5), Model())
    assert isinstance(memory.store, MemoryStore)
    assert memory.store.max_entries == 5
    assert (memory.name, memory.version) == ("model", "7")
    assert from_settings(Settings(cache_size=0), Model()) is None
    assert from_settings(Settings(), Sampler()) is None
    shared = from_settings(Settings(cache_size=0, cache_url="redis://127.0.0.1:1/0"), Model())
    assert isinstance(shared.store, RedisStore)


def test_redis_urls_lose_their_password_in_messages():
    store = RedisStore("redis://user:s3cret@127.0.0.1:1/0", 60.0)
    with pytest.raises(StoreError) as raised:
        store.get("k")
    assert "s3cret" not in str(raised.value)
    assert "127.0.0.1:1" in str(raised.value)


# -- a real Redis -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


def redis_cache(url, observer=None, version="1", ttl_s=60.0, **kwargs):
    return Cache(RedisStore(url, ttl_s, timeout_s=5.0), "model", version, observer, **kwargs)


@pytest.mark.e2e
def test_redis_a_hit_after_a_fill_and_a_changed_version_misses(redis_url):
    observer = Recorder()
    cache = redis_cache(redis_url, observer)
    params = {"text": "redis hit", "file": b"\x00\x01"}
    key_, found = cache.lookup(params)
    assert found is None
    output = {"embedding": np.linspace(0, 1, 384, dtype=np.float32)}
    miss = cache.fill(key_, output)
    hit = redis_cache(redis_url).lookup(params)[1]  # another worker's client
    assert encoding.dumps(hit) == encoding.dumps(miss)
    assert redis_cache(redis_url, version="2").lookup(params)[1] is None
    assert observer.results == {"miss": 1}
    assert not observer.errors


@pytest.mark.e2e
def test_redis_entries_expire_after_their_ttl(redis_url):
    cache = redis_cache(redis_url, ttl_s=0.5)
    key_ = cache.key_for({"text": "short-lived"})
    cache.fill(key_, {"y": 1})
    client = cache.store.client
    assert client.pttl(key_) != -1  # -1: no expiry (-2: already gone)
    deadline = time.monotonic() + WAIT_S
    while client.exists(key_) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.exists(key_)
    assert cache.lookup({"text": "short-lived"})[1] is None


@pytest.mark.e2e
def test_redis_sixteen_concurrent_identical_misses_compute_once(redis_url):
    observer = Recorder()
    cache = redis_cache(redis_url, observer)
    calls = []

    def compute():
        calls.append(1)
        observer.wait_coalesced(15)
        return {"y": 1}

    key_ = cache.key_for({"text": "sixteen"})
    results = concurrent_calls(cache, observer, key_, compute)
    assert len(calls) == 1
    assert Counter(r for _, r in results) == {"coalesced": 15, "miss": 1}
    assert redis_cache(redis_url).single_flight(key_, pytest.fail) == ({"y": 1}, "hit")
    assert not cache.store.client.exists(key_ + ":lock")


class ClaimWatch:
    """A store that says when its claim was refused (another worker holds the lock)."""

    def __init__(self, store):
        self.store = store
        self.name = store.name
        self.refused = threading.Event()

    def get(self, key_):
        return self.store.get(key_)

    def set(self, key_, value):
        self.store.set(key_, value)

    def claim(self, key_, ttl_s):
        claimed = self.store.claim(key_, ttl_s)
        if not claimed:
            self.refused.set()
        return claimed

    def release(self, key_):
        self.store.release(key_)


@pytest.mark.e2e
def test_redis_a_second_worker_waits_for_the_first_ones_compute(redis_url):
    first = redis_cache(redis_url, lock_s=WAIT_S)
    second_store = ClaimWatch(RedisStore(redis_url, 60.0, timeout_s=5.0))
    observer = Recorder()
    second = Cache(second_store, "model", "1", observer, lock_s=WAIT_S)
    key_ = first.key_for({"text": "two workers"})
    computing = threading.Event()

    def compute_first():
        computing.set()
        assert second_store.refused.wait(WAIT_S)
        return {"y": "first"}

    with ThreadPoolExecutor(2) as pool:
        one = pool.submit(first.single_flight, key_, compute_first)
        assert computing.wait(WAIT_S)
        two = pool.submit(second.single_flight, key_, pytest.fail)
        assert one.result(WAIT_S) == ({"y": "first"}, "miss")
        assert two.result(WAIT_S) == ({"y": "first"}, "coalesced")
    assert observer.results == {"coalesced": 1}


@pytest.mark.e2e
def test_redis_stopped_mid_test_makes_misses_and_counts_errors():
    observer = Recorder()
    with redis_server() as url:
        cache = redis_cache(url, observer)
        key_, _ = cache.lookup({"text": "x"})
        cache.fill(key_, {"y": 1})
        assert cache.lookup({"text": "x"})[1] == {"y": 1}
    # The server is gone: every call fails, none raises.
    assert cache.lookup({"text": "x"}) == (key_, None)
    cache.fill(key_, {"y": 2})
    assert cache.single_flight(key_, lambda: {"y": 3}) == ({"y": 3}, "miss")
    assert observer.results == {"hit": 1, "miss": 3}
    assert observer.errors["redis"] >= 3
    assert set(observer.errors) == {"redis"}


# A redis server that accepts connections and never answers, gevent-patched as
# the gevent worker is (sockets yes, threading no). Four greenlets ask it at once
# while a fifth keeps running: if a native lock were held across socket I/O, or
# the I/O itself blocked the hub, the four could never be in flight together.
SLOW_REDIS = """
from gevent import monkey
monkey.patch_all(thread=False)
import json, socket, gevent
from serving_core.cache.cache import Cache
from serving_core.cache.redisstore import RedisStore

silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(16)  # the kernel completes the handshakes; nothing ever reads
url = "redis://127.0.0.1:%d/0" % silent.getsockname()[1]
errors = []
class Observer:
    def cache_request(self, result): pass
    def cache_error(self, store): errors.append(store)

in_flight = 0
most_seen_by_other = 0
results = []
def request(n):
    global in_flight
    # Each greenlet its own store: the first failure's cool-down is not shared.
    cache = Cache(RedisStore(url, 60.0, timeout_s=2.0), "m", "1", Observer())
    in_flight += 1
    results.append(cache.single_flight(cache.key_for({"n": n}), lambda: {"n": n})[1])
    in_flight -= 1

def other():
    global most_seen_by_other
    while in_flight or not results:
        most_seen_by_other = max(most_seen_by_other, in_flight)
        gevent.sleep(0.001)

gevent.joinall([gevent.spawn(request, n) for n in range(4)] + [gevent.spawn(other)], timeout=60)
print(json.dumps({"results": results, "errors": errors, "most_seen_by_other": most_seen_by_other}))
"""


@pytest.mark.e2e
def test_a_silent_redis_does_not_block_the_gevent_hub():
    done = subprocess.run(
        [sys.executable, "-c", SLOW_REDIS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["results"] == ["miss"] * 4
    assert report["errors"].count("redis") >= 4
    assert report["most_seen_by_other"] == 4


def test_the_cache_imports_no_flask_and_redis_only_when_used():
    code = (
        "import sys, serving_core.cache.cache; "
        "print(sorted(m for m in ('flask', 'flask_restful', 'redis') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
