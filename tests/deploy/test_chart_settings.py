"""serving-core's settings: each camelCase `serving` value becomes its SERVING_*
variable, and what every container running serving-core gets is what serving-core's
own Settings accepts."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, get_args, get_type_hints

import helm_python as helm
import pytest

from serving_core.cache import stores
from serving_core.settings import PREFIX, Settings, SettingsError
from serving_core.stream import brokers
from tests.deploy.chart import (
    BATCH,
    CACHE_SECRET,
    CHART,
    STREAM_SETTINGS,
    VALUE_SETS,
    containers,
    env_of,
    find,
    render,
    serving_core_commands,
    serving_core_containers,
    serving_env,
    tagged,
)

# --- settings: camelCase values -> SERVING_* env -> serving-core's Settings ------

SETTINGS_TABLE = [
    # value key, value, env var, as the env carries it
    ("handler", "handlers/echo/handler.py", "SERVING_HANDLER", "handlers/echo/handler.py"),
    ("workers", 3, "SERVING_WORKERS", "3"),
    ("workerClass", "gthread", "SERVING_WORKER_CLASS", "gthread"),
    ("workerConnections", 250, "SERVING_WORKER_CONNECTIONS", "250"),
    ("threads", 48, "SERVING_THREADS", "48"),
    ("maxBatchSize", 24, "SERVING_MAX_BATCH_SIZE", "24"),
    ("lendCores", False, "SERVING_LEND_CORES", "false"),
    ("maxWaitMs", 2.5, "SERVING_MAX_WAIT_MS", "2.5"),
    ("batchPolicy", "fixed", "SERVING_BATCH_POLICY", "fixed"),
    ("maxQueue", 1000000, "SERVING_MAX_QUEUE", "1000000"),
    ("requestTimeoutSeconds", 0.5, "SERVING_REQUEST_TIMEOUT_S", "0.5"),
    ("maxTokens", 1024, "SERVING_MAX_TOKENS", "1024"),
    ("generationTimeoutSeconds", 600, "SERVING_GENERATION_TIMEOUT_S", "600"),
    ("maxBodyBytes", 4194304, "SERVING_MAX_BODY_BYTES", "4194304"),
    ("maxJsonDepth", 16, "SERVING_MAX_JSON_DEPTH", "16"),
    ("maxStringChars", 1048576, "SERVING_MAX_STRING_CHARS", "1048576"),
    ("bodyTimeoutSeconds", 2.5, "SERVING_BODY_TIMEOUT_S", "2.5"),
    ("trustedProxies", ["10.0.0.0/8", "::1"], "SERVING_TRUSTED_PROXIES", "10.0.0.0/8,::1"),
    ("drainSeconds", 7.5, "SERVING_DRAIN_S", "7.5"),
    ("gracefulTimeoutSeconds", 45, "SERVING_GRACEFUL_TIMEOUT_S", "45"),
    ("keepaliveSeconds", 2, "SERVING_KEEPALIVE_S", "2"),
    ("maxRequests", 5000, "SERVING_MAX_REQUESTS", "5000"),
    ("maxRequestsJitter", 250, "SERVING_MAX_REQUESTS_JITTER", "250"),
    ("maxRssBytes", 2147483648, "SERVING_MAX_RSS_BYTES", "2147483648"),
    ("hangMarginSeconds", 4.5, "SERVING_HANG_MARGIN_S", "4.5"),
    ("logLevel", "debug", "SERVING_LOG_LEVEL", "debug"),
    ("logFormat", "json", "SERVING_LOG_FORMAT", "json"),
    ("docsEnabled", False, "SERVING_DOCS_ENABLED", "false"),
    ("device", "cuda:1", "SERVING_DEVICE", "cuda:1"),
    ("dtype", "bfloat16", "SERVING_DTYPE", "bfloat16"),
    ("modelProcess", "shared", "SERVING_MODEL_PROCESS", "shared"),
    ("modelProcesses", 2, "SERVING_MODEL_PROCESSES", "2"),
    (
        "cacheUrl",
        "rediss://cache.example.com:6380/2",
        "SERVING_CACHE_URL",
        "rediss://cache.example.com:6380/2",
    ),
    ("cacheSize", 250000, "SERVING_CACHE_SIZE", "250000"),
    ("cacheTtlSeconds", 0.25, "SERVING_CACHE_TTL_S", "0.25"),
    ("cachePerKey", False, "SERVING_CACHE_PER_KEY", "false"),
    ("cacheHeader", True, "SERVING_CACHE_HEADER", "true"),
    (
        "payloadLogUrl",
        "https://monitor.example.com/events",
        "SERVING_PAYLOAD_LOG_URL",
        "https://monitor.example.com/events",
    ),
    ("payloadLogRate", 0.05, "SERVING_PAYLOAD_LOG_RATE", "0.05"),
    ("payloadLogErrors", False, "SERVING_PAYLOAD_LOG_ERRORS", "false"),
    ("payloadLogRedact", ["email", "ssn"], "SERVING_PAYLOAD_LOG_REDACT", "email,ssn"),
    ("payloadLogQueue", 5000, "SERVING_PAYLOAD_LOG_QUEUE", "5000"),
    ("modelRevision", "sha256:abc", "SERVING_MODEL_REVISION", "sha256:abc"),
    ("jobsEnabled", True, "SERVING_JOBS_ENABLED", "true"),
    ("jobsUrl", "redis://queue:6379/1", "SERVING_JOBS_URL", "redis://queue:6379/1"),
    ("jobsPath", "/data/jobs.db", "SERVING_JOBS_PATH", "/data/jobs.db"),
    ("jobsMaxQueue", 5000, "SERVING_JOBS_MAX_QUEUE", "5000"),
    ("jobsMaxStored", 20000, "SERVING_JOBS_MAX_STORED", "20000"),
    ("jobsMaxPerCaller", 50, "SERVING_JOBS_MAX_PER_CALLER", "50"),
    ("jobsTtlSeconds", 600, "SERVING_JOBS_TTL_S", "600"),
    ("jobsMaxAttempts", 5, "SERVING_JOBS_MAX_ATTEMPTS", "5"),
    ("jobsLeaseSeconds", 30.5, "SERVING_JOBS_LEASE_S", "30.5"),
    ("followupQueue", "minilm-large", "SERVING_FOLLOWUP_QUEUE", "minilm-large"),
    ("apiKeys", "0123456789abcdef-key", "SERVING_API_KEYS", "0123456789abcdef-key"),
    ("apiKeysFile", "/keys/api-keys", "SERVING_API_KEYS_FILE", "/keys/api-keys"),
    ("privateEndpoints", True, "SERVING_PRIVATE_ENDPOINTS", "true"),
    ("publicMetadata", False, "SERVING_PUBLIC_METADATA", "false"),  # true contradicts private
    ("pipelineWithoutKeys", True, "SERVING_PIPELINE_WITHOUT_KEYS", "true"),
    (
        "corsOrigins",
        ["https://app.example.com", "http://localhost:3000"],
        "SERVING_CORS_ORIGINS",
        "https://app.example.com,http://localhost:3000",
    ),
]
# `serving` keys that feed a setting from a Secret (env valueFrom.secretKeyRef)
# instead of a value.
FROM_SECRETS = {
    "cacheUrlSecret": "SERVING_CACHE_URL",
    "jobsUrlSecret": "SERVING_JOBS_URL",
    "payloadLogUrlSecret": "SERVING_PAYLOAD_LOG_URL",
    "apiKeysSecret": "SERVING_API_KEYS_FILE",  # mounted as a file, not an env value
}
# Set by the chart itself, not from `serving`.
CHART_MANAGED = {"SERVING_BIND", "SERVING_METRICS_DIR", "SERVING_GRPC_PORT"}
# Set from `model` (tests/deploy/test_chart_model.py).
MODEL_SETTINGS = {"SERVING_MODEL_URI", "SERVING_MODEL_CACHE", "SERVING_MODEL_OFFLINE"}
# Set from `otel` (tests/deploy/test_chart_otel.py): otlp when otel.enabled.
OTEL_SETTINGS = {"SERVING_TRACES"}


@pytest.mark.parametrize(("key", "value", "env", "expected"), SETTINGS_TABLE)
def test_each_serving_value_sets_its_env_var(
    chart: helm.Chart, key: str, value: Any, env: str, expected: str
) -> None:
    app = containers(find(render(chart, tagged({"serving": {key: value}})), "Deployment"))["app"]
    assert env_of(app)[env] == expected


def test_settings_table_covers_every_serving_value(chart: helm.Chart) -> None:
    assert {row[0] for row in SETTINGS_TABLE} | set(FROM_SECRETS) == set(chart.values["serving"])


def test_the_chart_sets_exactly_the_settings_serving_core_has() -> None:
    fields = {PREFIX + f.name.upper() for f in dataclasses.fields(Settings)}
    chart_sets = {row[2] for row in SETTINGS_TABLE} | CHART_MANAGED | MODEL_SETTINGS | OTEL_SETTINGS
    assert chart_sets | set(STREAM_SETTINGS.values()) == fields


def test_rendered_env_is_what_serving_core_accepts(chart: helm.Chart) -> None:
    values = tagged({"serving": {row[0]: row[1] for row in SETTINGS_TABLE}})
    env = env_of(containers(find(render(chart, values), "Deployment"))["app"])
    serving_env = {k: v for k, v in env.items() if k.startswith(PREFIX)}
    settings = Settings.from_env(serving_env, cores=2)
    assert settings.workers == 3
    assert settings.worker_class == "gthread"
    assert settings.batch_policy == "fixed"
    assert settings.worker_connections == 250
    assert settings.threads == 48
    assert settings.max_wait_ms == 2.5
    assert settings.max_queue == 1000000
    assert settings.request_timeout_s == 0.5
    assert settings.max_body_bytes == 4194304
    assert (settings.log_format, settings.docs_enabled) == ("json", False)
    assert settings.device == "cuda:1"
    assert settings.dtype == "bfloat16"
    assert settings.cache_url == "rediss://cache.example.com:6380/2"
    assert settings.cache_size == 250000
    assert settings.cache_ttl_s == 0.25
    assert settings.jobs_enabled is True
    assert settings.jobs_url == "redis://queue:6379/1"
    assert (settings.jobs_max_queue, settings.jobs_ttl_s) == (5000, 600)
    assert (settings.jobs_max_attempts, settings.jobs_lease_s) == (5, 30.5)
    assert settings.drain_s == 7.5
    assert settings.bind == "unix:/run/serving/gunicorn.sock"
    assert settings.metrics_dir == "/run/metrics"
    assert (settings.max_requests, settings.max_requests_jitter) == (5000, 250)
    assert (settings.max_rss_bytes, settings.hang_margin_s) == (2147483648, 4.5)
    assert (settings.max_json_depth, settings.max_string_chars) == (16, 1048576)
    assert settings.body_timeout_s == 2.5
    assert settings.trusted_proxies == ("10.0.0.0/8", "::1")


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_serving_core_container_starts_without_a_settings_error(
    chart: helm.Chart, values_name: str
) -> None:
    runs_serving_core = serving_core_containers(render(chart, VALUE_SETS[values_name]))
    assert runs_serving_core
    if VALUE_SETS[values_name].get("worker", {}).get("enabled"):
        assert "worker" in {c["name"] for c in runs_serving_core}
    for container in runs_serving_core:
        # The whole env, extraEnv included: a SERVING_* name there reaches Settings too;
        # then the URLs' own checks, which start-up runs before a model loads.
        env = serving_env(container)
        try:
            settings = Settings.from_env(env, cores=2)
            stores.check(settings.cache_url)
            if container["name"] == "stream":
                brokers.check(
                    settings.stream_source, settings.stream_sink, settings.stream_dead_letter
                )
        except (SettingsError, ValueError) as exc:
            pytest.fail(f"{values_name}, container {container['name']}: {exc}")


def test_the_settings_check_sees_extra_env() -> None:
    # What the check above does with a name the chart would emit from extraEnv
    # if it let one through (it refuses them: see TEMPLATE_REFUSALS).
    with pytest.raises(SettingsError, match="SERVING_CACHE_HOST"):
        Settings.from_env({"SERVING_CACHE_HOST": "redis"}, cores=2)


@pytest.mark.parametrize("values_name", VALUE_SETS)
def test_every_serving_core_command_the_chart_runs_exists(
    chart: helm.Chart, values_name: str
) -> None:
    commands = serving_core_commands()
    for container in serving_core_containers(render(chart, VALUE_SETS[values_name])):
        probes = [container.get(p, {}).get("exec", {}) for p in ("startupProbe", "readinessProbe")]
        probes.append(container.get("livenessProbe", {}).get("exec", {}))
        for argv in [container["command"], *(p["command"] for p in probes if p)]:
            assert argv[0] == "serving-core"
            assert argv[1] in commands, argv


def test_workers_threads_and_handler_are_left_to_serving_core_by_default(
    chart: helm.Chart,
) -> None:
    env = env_of(containers(find(render(chart, tagged({})), "Deployment"))["app"])
    assert "SERVING_WORKERS" not in env
    assert "SERVING_THREADS" not in env
    assert "SERVING_HANDLER" not in env
    assert (env["SERVING_DEVICE"], env["SERVING_DTYPE"]) == ("cpu", "float32")


def test_the_batch_policy_is_left_to_serving_core_by_default(chart: helm.Chart) -> None:
    # Settings' default is the one place it is said; the chart does not repeat it.
    assert chart.values["serving"]["batchPolicy"] == ""
    for container in serving_core_containers(render(chart, tagged({"batch": BATCH}))):
        assert "SERVING_BATCH_POLICY" not in env_of(container), container["name"]


def test_each_choice_the_schema_offers_is_one_serving_core_accepts(chart: helm.Chart) -> None:
    # A `serving` value with an enum is a Settings field with a Literal type: the same
    # names, plus "" where the chart leaves the variable to serving-core's default.
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["serving"]
    types = get_type_hints(Settings)
    checked = {}
    for key, _, env, _ in SETTINGS_TABLE:
        enum = schema["properties"][key].get("enum")
        if enum is None:
            continue
        choices = set(get_args(types[env.removeprefix(PREFIX).lower()]))
        unset = {""} if chart.values["serving"][key] == "" else set()
        checked[key] = set(enum) == choices | unset
    assert "batchPolicy" in checked
    assert [key for key, same in checked.items() if not same] == []


def test_extra_env_and_env_from_reach_the_app(chart: helm.Chart) -> None:
    app = containers(find(render(chart, VALUE_SETS["values-full"]), "Deployment"))["app"]
    by_name = {e["name"]: e for e in app["env"]}
    assert by_name["MODEL_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "model-secrets",
        "key": "token",
    }
    assert app["envFrom"] == [{"secretRef": {"name": "model-settings", "optional": True}}]


def test_each_serving_value_names_its_variable_in_the_generated_table() -> None:
    # The table is generated from values.yaml's comments (tests/deploy/test_chart_docs.py);
    # here: each `serving` key's description names the variable it becomes.
    readme = (CHART / "README.md").read_text()
    rows = dict(re.findall(r"^\| `serving\.(\w+)` +\| ([^|]*)\|", readme, re.MULTILINE))
    wanted = {key: env for key, _, env, _ in SETTINGS_TABLE} | FROM_SECRETS
    assert set(rows) == set(wanted)
    assert {k: env for k, env in wanted.items() if env not in rows[k]} == {}


# --- the inference cache's Redis URL ----------------------------------------------


def test_cache_url_from_a_secret_renders_as_a_secret_key_ref(chart: helm.Chart) -> None:
    values = tagged({"serving": {"cacheUrlSecret": CACHE_SECRET}, "batch": BATCH})
    for container in serving_core_containers(render(chart, values)):
        (entry,) = [e for e in container["env"] if e["name"] == "SERVING_CACHE_URL"]
        assert entry == {"name": "SERVING_CACHE_URL", "valueFrom": {"secretKeyRef": CACHE_SECRET}}


def test_redis_example_takes_the_cache_url_from_a_secret(chart: helm.Chart) -> None:
    app = containers(find(render(chart, VALUE_SETS["values-cache-redis"]), "Deployment"))["app"]
    by_name = {e["name"]: e for e in app["env"]}
    assert by_name["SERVING_CACHE_URL"]["valueFrom"]["secretKeyRef"] == CACHE_SECRET
    assert Settings.from_env(serving_env(app), cores=2).cache_url.startswith("redis://")


def test_cache_url_as_a_value_or_not_at_all(chart: helm.Chart) -> None:
    def env(values: dict[str, Any]) -> dict[str, str]:
        return env_of(containers(find(render(chart, tagged(values)), "Deployment"))["app"])

    # Unset: each worker's in-memory cache.
    assert "SERVING_CACHE_URL" not in env({})
    assert env({"serving": {"cacheUrl": "redis://redis:6379/0"}})["SERVING_CACHE_URL"] == (
        "redis://redis:6379/0"
    )
