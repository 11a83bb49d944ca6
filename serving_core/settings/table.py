"""The one place that reads ``SERVING_*`` environment variables.

``Settings.from_env(environ)`` takes the mapping as a parameter (tests pass a
dict), validates every value, and raises ``SettingsError`` naming the variable,
the value and what would be accepted. Nothing else in serving-core reads the
environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from serving_core.cores import usable_cores
from serving_core.settings.addresses import (
    BIND,
    BROKER_URL,
    CACHE_URL,
    JOBS_URL,
    MODEL_URI,
    ORIGINS,
    PAYLOAD_LOG_URL,
    PROXIES,
)
from serving_core.settings.grpcport import grpc_fault
from serving_core.settings.parsers import (
    ABSOLUTE_PATH,
    API_KEYS,
    BOOLEAN,
    DEVICE,
    NAMES,
    TEXT,
    integer,
    number,
    one_of,
    setting,
    spec,
)
from serving_core.settings.private import default_jobs_path, default_model_cache
from serving_core.settings.secrets import masked

PREFIX = "SERVING_"
DEFAULT_HANDLER = "handlers/minilm/handler.py"
# The names SERVING_BATCH_POLICY accepts; engine/policy.py's POLICIES maps each to its class.
BatchPolicy = Literal["adaptive", "fixed"]
ModelProcessMode = Literal["auto", "per-worker", "shared"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
LogFormat = Literal["text", "json"]
Traces = Literal["off", "otlp", "console"]
WorkerClass = Literal["gevent", "gthread"]
Dtype = Literal["float32", "float16", "bfloat16"]


class SettingsError(ValueError):
    """A ``SERVING_*`` variable has a value serving-core cannot use."""


@dataclass(frozen=True)
class Settings:
    """Validated configuration, read once at start-up and passed explicitly.

    Each field is one ``SERVING_*`` variable: its default, its parser and its
    doc, from which ``docs/settings.md``'s table is generated (settings.doc).
    """

    handler: str = setting(
        DEFAULT_HANDLER, TEXT, "the handler: a file, folder or module path, optionally `:Class`"
    )
    bind: str = setting("127.0.0.1:8000", BIND, "gunicorn's address")
    workers: int = setting(0, integer(1, 1024), "worker processes", shown="usable cores")
    worker_class: WorkerClass = setting(
        "gevent", one_of(WorkerClass), "a greenlet per request, or a thread per request"
    )
    worker_connections: int = setting(
        1000, integer(1, 1_000_000), "gevent: client connections per worker"
    )
    threads: int = setting(
        0,
        integer(1, 4096),
        "gthread: request threads per worker; the gRPC front's concurrent inference calls",
        shown="4 times max batch size",
    )
    max_batch_size: int = setting(16, integer(1, 4096), "most items per `predict_batch` call")
    lend_cores: bool = setting(
        True, BOOLEAN, "an idle worker's torch threads are lent to a busy one's batch"
    )
    max_wait_ms: float = setting(
        5.0, number(0.0, 60_000.0), "the fixed window; the most the adaptive policy adds"
    )
    batch_policy: BatchPolicy = setting(
        "adaptive", one_of(BatchPolicy), "wait only when it pays, or a fixed window"
    )
    max_queue: int = setting(
        0,
        integer(1, 1_000_000),
        "queued requests per worker before `503`",
        shown="2 times max batch size",
    )
    request_timeout_s: float = setting(
        10.0, number(0.001, 3600.0), "a request's deadline, from its arrival"
    )
    max_tokens: int = setting(
        256, integer(1, 1 << 20), "a generating handler: the most chunks a request may ask for"
    )
    generation_timeout_s: float = setting(
        300.0, number(0.001, 86_400.0), "a generating handler: the longest one generation runs"
    )
    max_body_bytes: int = setting(1024 * 1024, integer(1, 1 << 34), "larger bodies get `413`")
    max_json_depth: int = setting(64, integer(1, 1024), "a JSON body nested deeper gets `400`")
    max_string_chars: int = setting(
        256 * 1024,
        integer(1, 1 << 34),
        "a JSON body with a longer string or key, or a V2 `BYTES` element, gets `400`",
    )
    body_timeout_s: float = setting(
        10.0, number(0.001, 3600.0), "gevent: a body slower than this after its headers: `408`"
    )
    trusted_proxies: tuple[str, ...] = setting(
        ("127.0.0.1", "::1"), PROXIES, "peers whose `X-Request-Start` is believed"
    )
    drain_s: float = setting(
        0.0, number(0.0, 3600.0), "on SIGTERM, how long `/readyz` fails while serving goes on"
    )
    graceful_timeout_s: float = setting(
        30.0, number(0.0, 3600.0), "on SIGTERM, after the drain, time to finish in-flight work"
    )
    grpc_port: int = setting(
        0, integer(0, 65535), "the V2 gRPC front's port, on SERVING_BIND's host; 0: off"
    )
    keepalive_s: float = setting(5.0, number(0.0, 3600.0), "HTTP keep-alive (whole seconds)")
    max_requests: int = setting(
        0, integer(0, 1 << 40), "a worker is replaced after this many requests; `0`: never"
    )
    max_requests_jitter: int = setting(
        0, integer(0, 1 << 40), "a random 0..N added per worker", shown="max requests / 10"
    )
    max_rss_bytes: int = setting(
        0, integer(0, 1 << 50), "a worker is replaced past this resident memory; `0`: never"
    )
    hang_margin_s: float = setting(
        2.0, number(0.0, 3600.0), "a batch this late past its deadlines is a hung model"
    )
    log_level: LogLevel = setting("info", one_of(LogLevel), "the lowest level logged")
    log_format: LogFormat = setting(
        "text", one_of(LogFormat), "`json`: one JSON object per line (app and access log)"
    )
    traces: Traces = setting(
        "off",
        one_of(Traces),
        "spans to OTLP (`OTEL_EXPORTER_OTLP_*` say where) or stderr; `off` loads no OpenTelemetry",
    )
    payload_log_url: str = setting(
        "", PAYLOAD_LOG_URL, "where sampled requests and responses go as CloudEvents; empty: off"
    )
    payload_log_rate: float = setting(
        1.0, number(0.0, 1.0), "the fraction of answered requests logged, picked by request id"
    )
    payload_log_errors: bool = setting(
        True, BOOLEAN, "every request answered with an error is logged, whatever the rate"
    )
    payload_log_redact: tuple[str, ...] = setting(
        (), NAMES, "field names whose values are logged as `[redacted]`, besides the defaults"
    )
    payload_log_queue: int = setting(
        1000, integer(1, 1_000_000), "events a worker holds for the sink before it drops"
    )
    docs_enabled: bool = setting(True, BOOLEAN, "`GET /docs`, the API page")
    metrics_dir: str = setting(
        "", TEXT, "prometheus-client's multiprocess directory", shown="a new temp dir"
    )
    device: str = setting("cpu", DEVICE, "where the handler's model runs (`self.device`)")
    dtype: Dtype = setting("float32", one_of(Dtype), "the model's precision on a GPU")
    # auto is per-worker off the GPU because it measured so: on 2 CPU cores,
    # MiniLM at c=32 served 203 req/s per-worker against 110 shared, whose model
    # gets the core the two workers leave (bench/gpu.py --device cpu).
    model_process: ModelProcessMode = setting(
        "auto", one_of(ModelProcessMode), "a model thread in each worker, or one shared process"
    )
    model_processes: int = setting(
        0, integer(0, 64), "shared: how many model processes; `0`: one per visible GPU"
    )
    cache_url: str = setting("", CACHE_URL, "the inference cache's shared store; empty: memory")
    cache_size: int = setting(
        10_000, integer(0, 100_000_000), "entries of the in-memory cache; `0`: no cache"
    )
    cache_ttl_s: float = setting(
        3600.0, number(0.001, 365 * 86400.0), "how long a cached answer is used"
    )
    cache_header: bool = setting(
        False,
        BOOLEAN,
        "send `X-Cache` on `/predict` and V2 infer (it tells whether others asked the same)",
    )
    cache_per_key: bool = setting(
        True, BOOLEAN, "with API keys, each key has its own cache entries; `false`: shared"
    )
    # The Dockerfile sets it to its MODEL_REVISION build argument (CI: the git commit).
    model_revision: str = setting(
        "", TEXT, "the model build in every cache key: the image's git commit, or a weights digest"
    )
    model_uri: str = setting(
        "", MODEL_URI, "where the handler's artifacts live, fetched before the model loads"
    )
    model_cache: str = setting(
        default_model_cache(),
        ABSOLUTE_PATH,
        "where fetched artifacts are kept: one verified directory per revision",
        shown="`$TMPDIR/serving-core-UID/models`",
    )
    model_offline: bool = setting(
        False,
        BOOLEAN,
        "use the revision already fetched into SERVING_MODEL_CACHE; never ask the store",
    )
    jobs_enabled: bool = setting(True, BOOLEAN, "accept `POST /jobs`; off, `/jobs` is `404`")
    jobs_url: str = setting("", JOBS_URL, "the job queue's backend (a URL); empty: the SQLite file")
    jobs_path: str = setting(
        default_jobs_path(),
        TEXT,
        "that SQLite file (made mode 0600)",
        shown="`$TMPDIR/serving-core-UID/jobs.db`, a 0700 directory",
    )
    jobs_max_queue: int = setting(
        100_000, integer(1, 1 << 40), "unfinished jobs before `POST /jobs` answers `503`"
    )
    jobs_max_stored: int = setting(
        1_000_000,
        integer(1, 1 << 40),
        "jobs a queue holds in all (unfinished, or finished within the TTL) before `503`",
    )
    jobs_max_per_caller: int = setting(
        0, integer(0, 1 << 40), "unfinished jobs one API key may hold before `429`; `0`: no limit"
    )
    jobs_ttl_s: float = setting(
        86_400.0, number(1.0, 365 * 86400.0), "how long a finished job stays readable"
    )
    jobs_max_attempts: int = setting(
        3, integer(1, 1000), "attempts before a job is failed (a dead letter)"
    )
    jobs_lease_s: float = setting(
        60.0, number(0.1, 86400.0), "a taken job not finished by then is handed out again"
    )
    followup_queue: str = setting(
        "", TEXT, "the time-lag pattern: also queue each `/predict` for this handler"
    )
    stream_source: str = setting(
        "", BROKER_URL, "`serving-core stream`'s input: a queue or a stream"
    )
    stream_sink: str = setting("", BROKER_URL, "where `serving-core stream` publishes results")
    stream_dead_letter: str = setting(
        "", BROKER_URL, "where a message that failed goes, with its error (form: a sink's)"
    )
    stream_max_attempts: int = setting(
        3, integer(1, 1000), "runs of a message the model fails before it is dead-lettered"
    )
    # Settings are logged and printed: the keys are never in a repr.
    api_keys: tuple[str, ...] = setting((), API_KEYS, "any key turns the check on", secret=True)
    api_keys_file: str = setting(
        "", ABSOLUTE_PATH, "a file of keys, one per line, re-read when it changes"
    )
    private_endpoints: bool = setting(
        False, BOOLEAN, "`/metadata`, `/openapi.json`, `/metrics` and `/docs` need a key"
    )
    public_metadata: bool = setting(
        False, BOOLEAN, "with keys, `/metadata` and `/openapi.json` are open to anyone"
    )
    cors_origins: tuple[str, ...] = setting((), ORIGINS, "origins a browser page may call from")
    pipeline_without_keys: bool = setting(
        False, BOOLEAN, "a pipeline may send its stages keys while it has none itself"
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str], *, cores: int | None = None) -> Settings:
        """Build settings from ``SERVING_*`` variables; unknown ``SERVING_`` names are errors.

        ``cores`` overrides the detected usable cores (tests).
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(
            key
            for key in environ
            if key.startswith(PREFIX) and key[len(PREFIX) :].lower() not in fields
        )
        if unknown:
            known = ", ".join(PREFIX + name.upper() for name in fields)
            # The name only: a misspelt SERVING_API_KEY holds a secret.
            raise SettingsError(
                f"unknown setting {unknown[0]}; check the spelling (known settings: {known})"
            )
        parsers = {name: spec(f).parser for name, f in fields.items()}
        values: dict[str, Any] = {}
        for name, parse in parsers.items():
            raw = environ.get(PREFIX + name.upper())
            if raw is not None and raw.strip() != "":
                try:
                    values[name] = parse(PREFIX + name.upper(), raw.strip())
                except ValueError as error:  # the parser's message names variable and value
                    raise SettingsError(str(error)) from None
        if "jobs_path" not in values and environ.get("TMPDIR"):
            values["jobs_path"] = default_jobs_path(environ["TMPDIR"])  # as tempfile does
        settings = cls(**values)
        return settings.resolved(usable_cores() if cores is None else cores)

    def __repr__(self) -> str:
        # Settings are logged and printed: each URL without its password, as in any
        # message, and the secret fields (repr=False) not at all.
        shown = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.repr)
        return "Settings({})".format(
            ", ".join(f"{name}={masked(v) if isinstance(v, str) else v!r}" for name, v in shown)
        )

    @property
    def shared_model(self) -> bool:
        """Whether one shared model process runs the model (SERVING_MODEL_PROCESS)."""
        if self.model_process == "auto":
            return self.device.startswith("cuda")
        return self.model_process == "shared"

    def resolved(self, cores: int) -> Settings:
        """Fill the defaults that depend on the machine, then check cross-field rules."""
        workers = self.workers or max(1, cores)
        # (gthread only) A worker batches only the requests its threads hold at once,
        # and a request waiting for a thread is invisible to admission: four
        # batches' worth lets the next batches fill while one runs, and lets
        # overload be refused quickly instead of queueing inside gunicorn.
        threads = self.threads or 4 * self.max_batch_size
        # Two batches: one fills while one runs. A longer queue only adds
        # latency, and admission refuses what would miss its deadline anyway.
        # (gthread: every queued request holds a thread, so threads = four
        # batches leaves a batch's worth free to refuse newcomers at once.)
        max_queue = self.max_queue or 2 * self.max_batch_size
        jitter = self.max_requests_jitter or self.max_requests // 10
        settings = dataclasses.replace(
            self, workers=workers, threads=threads, max_queue=max_queue, max_requests_jitter=jitter
        )
        gevent = settings.worker_class == "gevent"
        if gevent and settings.worker_connections < settings.max_batch_size:
            raise SettingsError(
                f"SERVING_WORKER_CONNECTIONS={settings.worker_connections} is smaller than "
                f"SERVING_MAX_BATCH_SIZE={settings.max_batch_size}; a worker could never "
                "fill a batch: raise SERVING_WORKER_CONNECTIONS"
            )
        if settings.public_metadata and settings.private_endpoints:
            raise SettingsError(
                "SERVING_PUBLIC_METADATA=true opens /metadata and /openapi.json, "
                "SERVING_PRIVATE_ENDPOINTS=true closes them: set one of the two"
            )
        if settings.max_queue < settings.max_batch_size:
            raise SettingsError(
                f"SERVING_MAX_QUEUE={settings.max_queue} is smaller than "
                f"SERVING_MAX_BATCH_SIZE={settings.max_batch_size}; "
                "raise SERVING_MAX_QUEUE so that a full batch can queue"
            )
        fault = settings.grpc_port and grpc_fault(settings.grpc_port, settings.bind)
        if fault:
            raise SettingsError(fault)
        return settings
