"""The one place that reads ``SERVING_*`` environment variables.

``Settings.from_env(environ)`` takes the mapping as a parameter (tests pass a
dict), validates every value, and raises ``SettingsError`` naming the variable,
the value and what would be accepted. Nothing else in serving-core reads the
environment.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from serving_core.cores import usable_cores

PREFIX = "SERVING_"
DEFAULT_HANDLER = "handlers/minilm/handler.py"
BatchPolicy = Literal["adaptive", "fixed"]
ModelProcessMode = Literal["auto", "per-worker", "shared"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
LogFormat = Literal["text", "json"]
WorkerClass = Literal["gevent", "gthread"]
Dtype = Literal["float32", "float16", "bfloat16"]


class SettingsError(ValueError):
    """A ``SERVING_*`` variable has a value serving-core cannot use."""


@dataclass(frozen=True)
class Settings:
    """Validated configuration, read once at start-up and passed explicitly."""

    handler: str = DEFAULT_HANDLER
    bind: str = "127.0.0.1:8000"
    workers: int = 0  # 0: one per usable core, resolved by from_env
    worker_class: WorkerClass = "gevent"
    worker_connections: int = 1000  # gevent: client connections per worker
    threads: int = 0  # gthread: 0 is enough for every batch to fill, resolved by from_env
    max_batch_size: int = 16
    max_wait_ms: float = 5.0
    batch_policy: BatchPolicy = "adaptive"
    max_queue: int = 0  # 0: twice the batch size, resolved by from_env
    request_timeout_s: float = 10.0
    max_body_bytes: int = 1024 * 1024
    # A JSON body nested deeper, or with a longer string (a value or a key), is a 400.
    max_json_depth: int = 64
    max_string_chars: int = 256 * 1024
    # (gevent) The whole body must arrive within this long of its headers, or the
    # request is a 408 and the connection is closed.
    body_timeout_s: float = 10.0
    # Peers whose X-Request-Start is believed (the proxy in front); addresses or
    # CIDRs, or *. A unix-socket peer (the chart's nginx) is always trusted.
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")
    # On SIGTERM: /readyz answers 503 at once while every worker keeps accepting
    # for drain_s (a load balancer's time to stop sending: the chart's nginx
    # preStop sleeps as long); then they stop accepting and finish what they
    # hold within graceful_timeout_s.
    drain_s: float = 0.0
    graceful_timeout_s: float = 30.0
    keepalive_s: float = 5.0
    # Recycling: a worker finishes its requests and exits after max_requests (plus
    # a random 0..jitter, so workers started together do not leave together; 0:
    # a tenth of max_requests), or once its resident memory passes max_rss_bytes
    # (pages shared with the master included); gunicorn forks a new one from the
    # preloaded master. 0 turns either off.
    max_requests: int = 0
    max_requests_jitter: int = 0
    max_rss_bytes: int = 0
    # A batch still running this long after the last deadline of its requests
    # means the model is hung: the worker fails its queue and is replaced.
    hang_margin_s: float = 2.0
    log_level: LogLevel = "info"
    log_format: LogFormat = "text"  # json: one object per line (app and access log)
    docs_enabled: bool = True  # GET /docs, the API page (off for a private API)
    metrics_dir: str = ""
    # Where the handler's model runs, and in what precision; handlers read them
    # as ``self.device`` / ``self.dtype`` (see ``serving_core.device``).
    device: str = "cpu"
    dtype: Dtype = "float32"
    # Who runs the model: a model thread in each worker (per-worker), or one
    # process fed by every worker (shared: one model copy and one CUDA context,
    # batches across workers; see serving_core.modelprocess). auto: shared on a
    # cuda device, per-worker otherwise (on 2 CPU cores, MiniLM at c=32: 203
    # req/s per-worker against 110 shared, whose model gets the core the two
    # workers leave; bench/gpu.py --device cpu).
    model_process: ModelProcessMode = "auto"
    # Shared: how many model processes. 0: one per visible GPU with
    # SERVING_DEVICE=cuda (each on its own), else one; requests go to the one
    # with the fewest in flight.
    model_processes: int = 0
    # The inference cache: empty URL keeps it in each worker's memory (an LRU of
    # cache_size entries; 0 turns the cache off); redis://… shares it between
    # every worker and replica. Entries expire after cache_ttl_s.
    cache_url: str = ""
    cache_size: int = 10_000
    cache_ttl_s: float = 3600.0
    # Asynchronous jobs (POST /jobs, `serving-core worker`): empty URL keeps the
    # queue in a SQLite file (jobs_path) shared by the processes of one machine;
    # redis://… shares it between machines (what Kubernetes deployments use).
    jobs_enabled: bool = True  # off: /jobs answers 404 (a pod with no worker behind it)
    jobs_url: str = ""
    jobs_path: str = "/tmp/serving-core-jobs.db"
    jobs_max_queue: int = 100_000  # queued jobs before POST /jobs answers 503
    jobs_ttl_s: float = 86_400.0  # how long a finished job's result stays readable
    jobs_max_attempts: int = 3  # then the job is failed: a dead letter
    jobs_lease_s: float = 60.0  # a taken job not finished by then is handed out again
    # The time-lag pattern: /predict answers with this handler's result at once and
    # queues the same request for the (slow) handler whose name is this queue;
    # `serving-core worker` running that handler fills in its result.
    followup_queue: str = ""
    # Who may call (serving_core.web.access). With keys, every route but /healthz
    # and /readyz needs one; the keys file (one per line, from a Secret) is read
    # when the app is built and re-read when it changes. Never in a repr.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    api_keys_file: str = ""
    # /metadata, /openapi.json and /metrics (and /docs) behind the keys, or 404
    # when there are none; off: open to anyone, keys or not (Prometheus scrapes).
    private_endpoints: bool = False
    # Origins a browser may call from (CORS); empty: no CORS headers at all.
    cors_origins: tuple[str, ...] = ()

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
        values: dict[str, Any] = {}
        for name in fields:
            raw = environ.get(PREFIX + name.upper())
            if raw is not None and raw.strip() != "":
                values[name] = _PARSERS[name](PREFIX + name.upper(), raw.strip())
        settings = cls(**values)
        return settings.resolved(usable_cores() if cores is None else cores)

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
        if settings.max_queue < settings.max_batch_size:
            raise SettingsError(
                f"SERVING_MAX_QUEUE={settings.max_queue} is smaller than "
                f"SERVING_MAX_BATCH_SIZE={settings.max_batch_size}; "
                "raise SERVING_MAX_QUEUE so that a full batch can queue"
            )
        return settings


def _number(
    convert: Callable[[str], float], kind: str, minimum: float, maximum: float
) -> Callable[[str, str], Any]:
    def parse(name: str, raw: str) -> Any:
        try:
            value = convert(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not {kind}; set it to e.g. {minimum}") from None
        if math.isnan(value) or not minimum <= value <= maximum:
            raise SettingsError(f"{name}={raw!r} is out of range; use {minimum}..{maximum}")
        return value

    return parse


def _int(minimum: int, maximum: int = 1 << 40) -> Callable[[str, str], Any]:
    return _number(int, "an integer", minimum, maximum)


def _float(minimum: float, maximum: float = 1e9) -> Callable[[str, str], Any]:
    return _number(float, "a number", minimum, maximum)


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.lower()
        if value not in choices:
            raise SettingsError(f"{name}={raw!r} is not one of: {', '.join(choices)}")
        return value

    return parse


def _bind(name: str, raw: str) -> str:
    if raw.startswith("unix:"):
        if len(raw) == len("unix:"):
            raise SettingsError(
                f"{name}={raw!r} names no socket path; use unix:/run/serving/app.sock"
            )
        return raw
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SettingsError(
            f"{name}={raw!r} is not HOST:PORT or unix:PATH; use e.g. 127.0.0.1:8000"
        )
    return raw


def _text(name: str, raw: str) -> str:
    return raw


def _bool(name: str, raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean; use true or false")


def _cache_url(name: str, raw: str) -> str:
    if raw.split("://", 1)[0] not in ("redis", "rediss", "unix"):
        raise SettingsError(
            f"{name}={raw!r} is not a Redis URL; use redis://HOST:6379/0, rediss://… (TLS) "
            "or unix:///path/redis.sock, or leave it empty for the embedded default"
        )
    return raw


def _device(name: str, raw: str) -> str:
    value = raw.lower()
    index = value.removeprefix("cuda:")
    if value in ("cpu", "cuda", "auto") or (value.startswith("cuda:") and index.isdigit()):
        return value
    raise SettingsError(
        f"{name}={raw!r} is not a device; use cpu, cuda, cuda:N (the N-th GPU) or auto "
        "(cuda when a GPU is visible, else cpu)"
    )


# Printable ASCII without spaces or commas (the list separator): what a header carries.
_KEY = re.compile(r"[!-+\--~]+")
MIN_KEY_CHARS = 16


def api_keys(name: str, raw: str) -> tuple[str, ...]:
    """Keys from a comma-separated list or a file's lines; errors never quote a key."""
    keys = tuple(key.strip() for key in re.split(r"[,\n]", raw) if key.strip())
    for index, key in enumerate(keys, 1):
        if len(key) < MIN_KEY_CHARS or not _KEY.fullmatch(key):
            raise SettingsError(
                f"{name}: key {index} of {len(keys)} is not {MIN_KEY_CHARS} or more printable "
                "ASCII characters without spaces or commas; make keys with e.g. "
                "`openssl rand -hex 32`"
            )
    return keys


def _path(name: str, raw: str) -> str:
    if not raw.startswith("/"):
        raise SettingsError(f"{name}={raw!r} is not an absolute path; use e.g. /run/secrets/keys")
    return raw


_ORIGIN = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")


def _origins(name: str, raw: str) -> tuple[str, ...]:
    origins = tuple(origin.strip() for origin in raw.split(",") if origin.strip())
    if "*" in origins and len(origins) > 1:
        raise SettingsError(f"{name}={raw!r} mixes * with origins; use * alone, or origins alone")
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise SettingsError(
                f"{name} holds {origin!r}, which is not an origin; use scheme://host[:port] "
                "with no path or trailing slash, e.g. https://app.example.com, or *"
            )
    return origins


def _proxies(name: str, raw: str) -> tuple[str, ...]:
    entries = tuple(entry.strip() for entry in raw.split(",") if entry.strip())
    if "*" in entries:
        if len(entries) > 1:
            raise SettingsError(f"{name}={raw!r} mixes * with addresses; use * alone")
        return entries
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise SettingsError(
                f"{name} holds {entry!r}, which is not an IP address or CIDR; use e.g. "
                "127.0.0.1,10.0.0.0/8 (the addresses your proxy connects from), or *"
            ) from None
    return entries


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    "handler": _text,
    "bind": _bind,
    "workers": _int(1, 1024),
    "worker_class": _choice("gevent", "gthread"),
    "worker_connections": _int(1, 1_000_000),
    "threads": _int(1, 4096),
    "max_batch_size": _int(1, 4096),
    "max_wait_ms": _float(0.0, 60_000.0),
    "batch_policy": _choice("adaptive", "fixed"),
    "model_process": _choice("auto", "per-worker", "shared"),
    "model_processes": _int(0, 64),
    "max_queue": _int(1, 1_000_000),
    "request_timeout_s": _float(0.001, 3600.0),
    "max_body_bytes": _int(1, 1 << 34),
    "max_json_depth": _int(1, 1024),
    "max_string_chars": _int(1, 1 << 34),
    "body_timeout_s": _float(0.001, 3600.0),
    "trusted_proxies": _proxies,
    "drain_s": _float(0.0, 3600.0),
    "graceful_timeout_s": _float(0.0, 3600.0),
    "keepalive_s": _float(0.0, 3600.0),
    "max_requests": _int(0, 1 << 40),
    "max_requests_jitter": _int(0, 1 << 40),
    "max_rss_bytes": _int(0, 1 << 50),
    "hang_margin_s": _float(0.0, 3600.0),
    "log_level": _choice("debug", "info", "warning", "error", "critical"),
    "log_format": _choice("text", "json"),
    "docs_enabled": _bool,
    "metrics_dir": _text,
    "device": _device,
    "dtype": _choice("float32", "float16", "bfloat16"),
    "cache_url": _cache_url,
    "jobs_enabled": _bool,
    "jobs_url": _cache_url,
    "jobs_path": _text,
    "jobs_max_queue": _int(1, 1 << 40),
    "jobs_ttl_s": _float(1.0, 365 * 86400.0),
    "jobs_max_attempts": _int(1, 1000),
    "jobs_lease_s": _float(0.1, 86400.0),
    "followup_queue": _text,
    "cache_size": _int(0, 100_000_000),
    "cache_ttl_s": _float(0.001, 365 * 86400.0),
    "api_keys": api_keys,
    "api_keys_file": _path,
    "private_endpoints": _bool,
    "cors_origins": _origins,
}
