"""``cache.stores``: the store SERVING_CACHE_URL's scheme picks checks the URL, at
start-up before a model loads, and says what to fix."""

from __future__ import annotations

import importlib
import inspect
import subprocess
from pathlib import Path

import pytest

from serving_core.cache import stores
from serving_core.cache.redisstore import RedisStore
from serving_core.cache.stores import STORES, StoreBackend
from tests.servers import SERVING_CORE, base_env


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("redis://cache:99999", "'redis://cache:99999' has a port that is not 0..65535"),
        ("redis://cache:port/0", "has a port that is not 0..65535"),
        ("unix://", "'unix://' names no socket path"),
        ("redis:/cache", "no scheme names no cache store; use a URL of one of redis://"),
    ],
)
def test_a_bad_redis_url_is_refused_by_its_store_naming_the_variable(url: str, said: str) -> None:
    with pytest.raises(ValueError, match=r"^SERVING_CACHE_URL=") as info:
        stores.check(url)
    assert said in str(info.value)


def test_an_unknown_scheme_lists_the_tables_schemes_and_what_empty_means() -> None:
    with pytest.raises(ValueError, match="names no cache store") as info:
        stores.check("sqlite:///jobs.db")
    message = str(info.value)
    assert message.startswith("SERVING_CACHE_URL='sqlite:///jobs.db': sqlite:// names no")
    assert "redis://, rediss://, unix://" in message
    assert "leave it empty for each worker's memory" in message


def test_a_bad_url_is_quoted_without_its_password() -> None:
    with pytest.raises(ValueError, match="has a port") as info:
        stores.check("redis://user:s3cret@cache:99999/0")
    assert "'redis://user:***@cache:99999/0' has a port that is not" in str(info.value)
    assert "s3cret" not in str(info.value)
    with pytest.raises(ValueError, match="names no cache store") as info:
        stores.check("memcached://user:s3cret@cache:11211")
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("url", ["", "redis://q:6379/1", "rediss://[::1]:6380", "unix:///r.sock"])
def test_urls_that_redis_py_takes_are_taken(url: str) -> None:
    stores.check(url)


def test_opening_a_store_checks_its_url_first() -> None:
    assert isinstance(stores.open_store("redis://127.0.0.1:1/0", 60.0), RedisStore)
    with pytest.raises(ValueError, match="has a port that is not"):
        stores.open_store("redis://127.0.0.1:99999/0", 60.0)


@pytest.mark.parametrize("module", sorted(set(STORES.values())))
def test_each_store_module_has_the_backends_functions(module: str) -> None:
    store = importlib.import_module(module)
    for name in ("check", "open_store"):
        wanted = inspect.signature(getattr(StoreBackend, name))
        found = inspect.signature(getattr(store, name))
        assert list(found.parameters) == list(wanted.parameters)[1:], (module, name)


def test_start_up_refuses_a_bad_cache_url_before_the_handler_loads(tmp_path: Path) -> None:
    handler = tmp_path / "handler.py"
    handler.write_text("raise SystemExit('the handler was imported')\n")
    ran = subprocess.run(
        [str(SERVING_CORE), "check", str(handler)],
        env=base_env({"SERVING_CACHE_URL": "redis://u:pw@c:99999/0"}),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert ran.returncode != 0
    assert "SERVING_CACHE_URL='redis://u:***@c:99999/0' has a port" in ran.stderr
    assert "the handler was imported" not in ran.stderr + ran.stdout
