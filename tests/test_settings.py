from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from serving_core.settings import Settings, SettingsError
from serving_core.settings import doc as settingsdoc
from serving_core.settings.parsers import TEXT, setting

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_resolve_workers_from_cores_and_threads_from_batch_size():
    settings = Settings.from_env({}, cores=4)
    assert settings.workers == 4
    assert settings.worker_class == "gevent"
    assert settings.worker_connections == 1000
    assert settings.threads == 4 * settings.max_batch_size
    assert settings.max_queue == 2 * settings.max_batch_size
    assert settings.bind == "127.0.0.1:8000"
    assert settings.handler == "handlers/minilm/handler.py"


def test_every_variable_is_read_with_its_type():
    env = {
        "SERVING_HANDLER": "handlers/echo/handler.py",
        "SERVING_BIND": "unix:/run/serving/app.sock",
        "SERVING_WORKERS": "3",
        "SERVING_WORKER_CLASS": "GTHREAD",
        "SERVING_WORKER_CONNECTIONS": "500",
        "SERVING_THREADS": "40",
        "SERVING_MAX_BATCH_SIZE": "8",
        "SERVING_MAX_WAIT_MS": "2.5",
        "SERVING_BATCH_POLICY": "FIXED",
        "SERVING_MAX_QUEUE": "100",
        "SERVING_REQUEST_TIMEOUT_S": "1.5",
        "SERVING_MAX_BODY_BYTES": "2048",
        "SERVING_GRACEFUL_TIMEOUT_S": "5",
        "SERVING_KEEPALIVE_S": "2",
        "SERVING_LOG_LEVEL": "debug",
        "SERVING_LOG_FORMAT": "JSON",
        "SERVING_DOCS_ENABLED": "no",
        "SERVING_METRICS_DIR": "/tmp/m",
        "SERVING_DEVICE": "cuda:1",
        "SERVING_DTYPE": "bfloat16",
        "SERVING_CACHE_URL": "redis://cache:6379/2",
        "SERVING_CACHE_SIZE": "0",
        "SERVING_CACHE_TTL_S": "60",
        "SERVING_JOBS_ENABLED": "off",
        "SERVING_JOBS_URL": "redis://queue:6379/1",
        "SERVING_JOBS_PATH": "/data/jobs.db",
        "SERVING_JOBS_MAX_QUEUE": "500",
        "SERVING_JOBS_TTL_S": "600",
        "SERVING_JOBS_MAX_ATTEMPTS": "5",
        "SERVING_JOBS_LEASE_S": "30",
        "SERVING_FOLLOWUP_QUEUE": "all-minilm-l6-v2",
    }
    settings = Settings.from_env(env, cores=2)
    assert settings == Settings(
        handler="handlers/echo/handler.py",
        bind="unix:/run/serving/app.sock",
        workers=3,
        worker_class="gthread",
        worker_connections=500,
        threads=40,
        max_batch_size=8,
        max_wait_ms=2.5,
        batch_policy="fixed",
        max_queue=100,
        request_timeout_s=1.5,
        max_body_bytes=2048,
        graceful_timeout_s=5.0,
        keepalive_s=2.0,
        log_level="debug",
        log_format="json",
        docs_enabled=False,
        metrics_dir="/tmp/m",
        device="cuda:1",
        dtype="bfloat16",
        cache_url="redis://cache:6379/2",
        cache_size=0,
        cache_ttl_s=60.0,
        jobs_enabled=False,
        jobs_url="redis://queue:6379/1",
        jobs_path="/data/jobs.db",
        jobs_max_queue=500,
        jobs_ttl_s=600.0,
        jobs_max_attempts=5,
        jobs_lease_s=30.0,
        followup_queue="all-minilm-l6-v2",
    )


def test_non_serving_variables_are_ignored():
    assert Settings.from_env({"PATH": "/bin", "HOME": "/root"}, cores=1).workers == 1


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("SERVING_WORKERS", "two", "is not an integer"),
        ("SERVING_WORKERS", "0", "out of range"),
        ("SERVING_MAX_BATCH_SIZE", "-1", "out of range"),
        ("SERVING_MAX_WAIT_MS", "soon", "is not a number"),
        ("SERVING_MAX_WAIT_MS", "nan", "out of range"),
        ("SERVING_REQUEST_TIMEOUT_S", "0", "out of range"),
        ("SERVING_MAX_TOKENS", "0", "out of range"),
        ("SERVING_GENERATION_TIMEOUT_S", "forever", "is not a number"),
        ("SERVING_BATCH_POLICY", "greedy", "is not one of: adaptive, fixed"),
        ("SERVING_WORKER_CLASS", "sync", "is not one of: gevent, gthread"),
        ("SERVING_WORKER_CONNECTIONS", "0", "out of range"),
        ("SERVING_BIND", "8000", "is not HOST:PORT or unix:PATH"),
        ("SERVING_BIND", "localhost:99999", "is not HOST:PORT"),
        ("SERVING_BIND", "unix:", "names no socket path"),
        ("SERVING_LOG_LEVEL", "loud", "is not one of"),
        # A backend's URL needs a scheme here; its store, broker or queue checks the
        # rest (tests/cache/test_stores.py, tests/stream/test_brokers.py,
        # tests/jobs/test_backends.py).
        ("SERVING_CACHE_URL", "cache:6379", "is not a URL; use SCHEME://"),
        ("SERVING_STREAM_SOURCE", "queue", "is not a URL; use SCHEME://"),
        ("SERVING_STREAM_SINK", "/results", "is not a URL; use SCHEME://"),
        ("SERVING_STREAM_DEAD_LETTER", "dead", "is not a URL; use SCHEME://"),
        ("SERVING_JOBS_URL", "queue:6379", "is not a URL; use SCHEME://"),
        ("SERVING_CACHE_SIZE", "-1", "out of range"),
        ("SERVING_JOBS_ENABLED", "maybe", "is not a boolean"),
        ("SERVING_DRAIN_S", "-1", "out of range"),
        ("SERVING_DRAIN_S", "soon", "is not a number"),
    ],
)
def test_a_bad_value_names_the_variable_and_the_value(name, value, expected):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value}, cores=2)
    message = str(info.value)
    assert name in message
    assert repr(value) in message or value in message
    assert expected in message


def test_an_unknown_setting_is_named_without_its_value():
    # A misspelt SERVING_API_KEY holds a secret: the error must not print it.
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"SERVING_API_KEY": "s3cret-s3cret-s3cret"}, cores=2)
    message = str(info.value)
    assert "unknown setting SERVING_API_KEY;" in message
    assert "SERVING_API_KEYS" in message  # the known names, to compare the spelling with
    assert "s3cret" not in message


def test_api_keys_cors_origins_and_private_endpoints_are_read():
    env = {
        "SERVING_API_KEYS": " 0123456789abcdef-one ,,0123456789abcdef-two ",
        "SERVING_API_KEYS_FILE": "/run/secrets/api-keys/keys",
        "SERVING_PRIVATE_ENDPOINTS": "true",
        "SERVING_CORS_ORIGINS": "https://app.example.com, http://localhost:3000,http://[::1]:8080",
    }
    settings = Settings.from_env(env, cores=2)
    assert settings.api_keys == ("0123456789abcdef-one", "0123456789abcdef-two")
    assert settings.api_keys_file == "/run/secrets/api-keys/keys"
    assert settings.private_endpoints is True
    assert settings.cors_origins == (
        "https://app.example.com",
        "http://localhost:3000",
        "http://[::1]:8080",
    )
    assert Settings.from_env({"SERVING_CORS_ORIGINS": "*"}, cores=2).cors_origins == ("*",)
    # Settings are logged and printed: the keys never are.
    assert "0123456789abcdef" not in repr(settings)
    defaults = Settings.from_env({}, cores=2)
    assert (defaults.api_keys, defaults.cors_origins, defaults.private_endpoints) == ((), (), False)


@pytest.mark.parametrize(
    "keys", ["short", "0123456789abcdef,tiny", "0123456789 abcdef0", "0123456789abcdef\u00e9"]
)
def test_a_weak_or_unsendable_key_is_refused_without_quoting_it(keys):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"SERVING_API_KEYS": keys}, cores=2)
    message = str(info.value)
    assert "SERVING_API_KEYS" in message
    assert "openssl rand" in message
    for part in keys.replace(",", " ").split():
        assert part not in message


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("SERVING_CORS_ORIGINS", "https://app.example.com/", "not an origin"),
        ("SERVING_CORS_ORIGINS", "app.example.com", "not an origin"),
        ("SERVING_CORS_ORIGINS", "*,https://app.example.com", "mixes *"),
        ("SERVING_API_KEYS_FILE", "keys.txt", "not an absolute path"),
        ("SERVING_PRIVATE_ENDPOINTS", "sometimes", "not a boolean"),
    ],
)
def test_bad_access_settings_are_refused_naming_the_variable(name, value, expected):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: value}, cores=2)
    assert name in str(info.value)
    assert expected in str(info.value)


def test_a_queue_smaller_than_a_batch_is_refused():
    with pytest.raises(SettingsError, match="SERVING_MAX_QUEUE=4 is smaller than"):
        Settings.from_env({"SERVING_MAX_QUEUE": "4", "SERVING_MAX_BATCH_SIZE": "8"}, cores=2)


def test_gevent_workers_need_room_for_a_full_batch():
    env = {"SERVING_WORKER_CONNECTIONS": "4", "SERVING_MAX_BATCH_SIZE": "8"}
    with pytest.raises(SettingsError, match="SERVING_WORKER_CONNECTIONS=4 is smaller than"):
        Settings.from_env(env, cores=2)
    # gthread holds its requests in threads; the connection limit does not apply.
    assert Settings.from_env({**env, "SERVING_WORKER_CLASS": "gthread"}, cores=2).threads == 32


def test_empty_values_mean_the_default():
    assert Settings.from_env({"SERVING_WORKERS": ""}, cores=3).workers == 3


def test_recycling_is_off_by_default_and_jitter_defaults_to_a_tenth():
    settings = Settings.from_env({}, cores=1)
    assert (settings.max_requests, settings.max_requests_jitter) == (0, 0)
    assert (settings.max_rss_bytes, settings.hang_margin_s) == (0, 2.0)
    env = {"SERVING_MAX_REQUESTS": "5000", "SERVING_MAX_RSS_BYTES": "2147483648"}
    settings = Settings.from_env(env, cores=1)
    assert (settings.max_requests_jitter, settings.max_rss_bytes) == (500, 2**31)
    env |= {"SERVING_MAX_REQUESTS_JITTER": "7", "SERVING_HANG_MARGIN_S": "0.5"}
    settings = Settings.from_env(env, cores=1)
    assert (settings.max_requests_jitter, settings.hang_margin_s) == (7, 0.5)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("SERVING_MAX_REQUESTS", "-1", "is out of range"),
        ("SERVING_MAX_RSS_BYTES", "2G", "is not an integer"),
        ("SERVING_HANG_MARGIN_S", "-1", "is out of range"),
    ],
)
def test_a_bad_recycling_setting_names_itself(name, value, expected):
    with pytest.raises(SettingsError, match=f"{name}='{value}' {expected}"):
        Settings.from_env({name: value}, cores=1)


def test_body_limits_and_trusted_proxies_are_read():
    settings = Settings.from_env({}, cores=1)
    assert (settings.max_json_depth, settings.max_string_chars) == (64, 262144)
    assert settings.body_timeout_s == 10.0
    assert settings.trusted_proxies == ("127.0.0.1", "::1")
    env = {
        "SERVING_MAX_JSON_DEPTH": "8",
        "SERVING_MAX_STRING_CHARS": "1000",
        "SERVING_BODY_TIMEOUT_S": "2.5",
        "SERVING_TRUSTED_PROXIES": "10.0.0.0/8, fd00::/8,127.0.0.1",
    }
    settings = Settings.from_env(env, cores=1)
    assert (settings.max_json_depth, settings.max_string_chars) == (8, 1000)
    assert settings.body_timeout_s == 2.5
    assert settings.trusted_proxies == ("10.0.0.0/8", "fd00::/8", "127.0.0.1")
    assert Settings.from_env({"SERVING_TRUSTED_PROXIES": "*"}, cores=1).trusted_proxies == ("*",)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("SERVING_MAX_JSON_DEPTH", "0", "is out of range"),
        ("SERVING_MAX_JSON_DEPTH", "1025", "is out of range"),
        ("SERVING_MAX_STRING_CHARS", "many", "is not an integer"),
        ("SERVING_BODY_TIMEOUT_S", "0", "is out of range"),
        ("SERVING_TRUSTED_PROXIES", "nginx", "not an IP address or CIDR"),
        ("SERVING_TRUSTED_PROXIES", "10.0.0.0/33", "not an IP address or CIDR"),
        ("SERVING_TRUSTED_PROXIES", "*,127.0.0.1", "mixes *"),
    ],
)
def test_a_bad_body_limit_or_proxy_names_itself(name, value, expected):
    with pytest.raises(SettingsError, match=expected) as caught:
        Settings.from_env({name: value}, cores=1)
    assert name in str(caught.value)


def test_the_job_queue_url_says_what_an_empty_one_means():
    # Not the cache's wording (tests/cache/test_stores.py): empty is the SQLite file here.
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"SERVING_JOBS_URL": "jobs.db"}, cores=1)
    assert "leave it empty for the SQLite file at SERVING_JOBS_PATH" in str(info.value)


@pytest.mark.parametrize(
    "name", ["SERVING_CACHE_URL", "SERVING_STREAM_SOURCE", "SERVING_STREAM_SINK"]
)
def test_a_url_without_a_scheme_is_quoted_without_its_password(name):
    with pytest.raises(SettingsError) as info:
        Settings.from_env({name: "user:s3cret@cache:6379/0"}, cores=1)
    assert "'user:***@cache:6379/0' is not a URL" in str(info.value)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    "url", ["redis://q:6379/1", "kafka://a:9092,b:9092/t?group=g", "toy:///tmp/queue"]
)
def test_a_url_of_any_scheme_is_left_to_its_backend(url):
    # Which schemes a backend takes is its table's business (cache.stores, stream.brokers).
    settings = Settings.from_env(
        {"SERVING_CACHE_URL": url, "SERVING_STREAM_SOURCE": url, "SERVING_STREAM_SINK": url},
        cores=1,
    )
    assert settings.cache_url == settings.stream_source == settings.stream_sink == url


@pytest.mark.parametrize("url", ["redis://q:6379/1", "rediss://[::1]:6380", "unix:///r.sock"])
def test_redis_urls_that_redis_py_takes_are_taken(url):
    assert Settings.from_env({"SERVING_JOBS_URL": url}, cores=1).jobs_url == url


@pytest.mark.parametrize(
    ("name", "choices"),
    [
        ("worker_class", ("gevent", "gthread")),
        ("log_level", ("debug", "info", "warning", "error", "critical")),
        ("model_process", ("auto", "per-worker", "shared")),
    ],
)
def test_a_field_with_choices_takes_them_from_its_type(name, choices):
    field = {f.name: f for f in dataclasses.fields(Settings)}[name]
    assert field.metadata["spec"].parser.choices == choices
    with pytest.raises(SettingsError, match=f"is not one of: {', '.join(choices)}"):
        Settings.from_env({f"SERVING_{name.upper()}": "nope"}, cores=1)


def test_the_settings_doc_has_the_table_settings_generates():
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert settingsdoc.with_table(text, settingsdoc.table()) == text, (
        "docs/settings.md's table differs from Settings: run `make docs-settings`"
    )


def test_the_table_has_a_row_per_setting_with_its_default_and_what_it_accepts():
    rows = settingsdoc.table().splitlines()[2:]
    assert len(rows) == len(dataclasses.fields(Settings))
    assert "| `SERVING_MAX_BATCH_SIZE` | `16` | integer, 1 to 4,096 |" in rows[6]
    by_name = {row.split(" | ")[0]: row for row in rows}
    assert "| usable cores |" in by_name["| `SERVING_WORKERS`"]
    assert "| `127.0.0.1,::1` |" in by_name["| `SERVING_TRUSTED_PROXIES`"]
    assert "| `gevent`, `gthread` |" in by_name["| `SERVING_WORKER_CLASS`"]
    assert "| empty |" in by_name["| `SERVING_API_KEYS`"]


@dataclasses.dataclass(frozen=True)
class _Undocumented(Settings):
    extra: int = 1  # declared without setting(): no parser, no doc


def test_a_field_without_a_parser_and_a_doc_is_named():
    with pytest.raises(TypeError, match=r"Settings.extra is not declared with setting\("):
        settingsdoc.table(_Undocumented)
    with pytest.raises(TypeError, match=r"Settings.extra is not declared with setting\("):
        _Undocumented.from_env({}, cores=1)


@dataclasses.dataclass(frozen=True)
class _Grown(Settings):
    extra: str = setting("", TEXT, "a setting added later")


def test_the_generator_rewrites_only_the_table_and_check_says_when_it_is_stale(tmp_path):
    doc = tmp_path / "settings.md"
    stale = f"# Title\n\nprose\n\n{settingsdoc.START}\n| old |\n{settingsdoc.END}\n\nmore prose\n"
    doc.write_text(stale)
    command = [sys.executable, "-m", "serving_core.settings.doc", str(doc)]
    checked = subprocess.run([*command, "--check"], capture_output=True, text=True, check=False)
    assert checked.returncode == 1
    assert "stale; run python -m serving_core.settings.doc" in checked.stderr
    assert doc.read_text() == stale
    subprocess.run(command, check=True, capture_output=True)
    text = doc.read_text()
    assert text.startswith("# Title\n\nprose\n\n")
    assert text.endswith(f"{settingsdoc.END}\n\nmore prose\n")
    assert settingsdoc.table() in text
    assert "| old |" not in text
    assert subprocess.run([*command, "--check"], check=False).returncode == 0
    # A field added to Settings is a new row, with its doc.
    grown = settingsdoc.with_table(text, settingsdoc.table(_Grown))
    assert "| `SERVING_EXTRA` | empty | any text | a setting added later |" in grown


def test_a_doc_without_its_markers_is_refused():
    with pytest.raises(ValueError, match="settings-table:start"):
        settingsdoc.with_table("# Settings\n", settingsdoc.table())
