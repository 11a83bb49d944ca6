"""A pipeline file (``pipeline.yaml``) read into a validated ``PipelineSpec``.

```yaml
name: iris                 # /metadata and the logs (default: the folder's name)
version: "1"
kind: parallel             # serial: one stage after another; parallel: all at once
aggregate: best_label      # parallel only: all (a result or an error per stage) or best_label
score_field: probability   # best_label: the stage output's score (default probability)
readiness: false           # true: /readyz also asks each required stage's /readyz (cached)
pool_size: 64              # keep-alive connections per stage and worker
input_schema: {...}        # optional JSON Schema of the request
stages:
  - name: setosa
    url_env: IRIS_SETOSA_URL   # the variable holding the stage's base URL (HTTP)
    # or, for a stage that speaks V2 gRPC (serving-core's SERVING_GRPC_PORT, Triton):
    # grpc_env: IDS_GRPC       # the variable holding its host:port
    # model: my-model          # the V2 model to call (grpc_env only)
    key_env: IRIS_API_KEY      # optional: the variable holding the API key the stage
                               # wants (sent as Authorization: Bearer); unset: none
    path: /predict             # default /predict
    timeout_s: 1.0             # capped by what is left of the request's deadline
    optional: false            # true: skipped, with the reason, on any failure
    retries: 2                 # connection failures only (refused, unreachable);
                               # gRPC: UNAVAILABLE and RESOURCE_EXHAUSTED too
    label: setosa              # best_label: the label this stage scores (default: name)
    into: null                 # serial: the next input gets the output under this key
                               # (default: the output's fields merged into it)
```

Every problem stops start-up with a ``PipelineError`` naming the file and the
key (``stages[1].timeout_s``). Imports no Flask and reads no environment: the
stage URLs are looked up in the mapping the CLI passes down.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from serving_core.errors import HandlerError
from serving_core.pipeline.fields import count, env_name, flag, no_unknown, text

KINDS = ("serial", "parallel")
AGGREGATES = ("all", "best_label")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_TOP_KEYS = {
    "name",
    "version",
    "kind",
    "aggregate",
    "score_field",
    "readiness",
    "pool_size",
    "input_schema",
    "stages",
}
_STAGE_KEYS = {
    "name",
    "url_env",
    "grpc_env",
    "model",
    "key_env",
    "path",
    "timeout_s",
    "optional",
    "retries",
    "label",
    "into",
}


class PipelineError(HandlerError):
    """The pipeline file cannot be served; the message names the file and the key."""


Fail = Callable[[str, str], "PipelineError"]


@dataclass(frozen=True)
class StageSpec:
    name: str
    # The variable naming where the stage is (url_env, or grpc_env for a gRPC stage)
    # and its value: a base URL, or host:port. None while it is unset.
    url_env: str
    url: str | None
    path: str = "/predict"
    timeout_s: float = 2.0
    optional: bool = False
    retries: int = 2
    label: str = ""
    into: str | None = None
    key_env: str | None = None
    # The API key the stage's service wants (its SERVING_API_KEYS), from key_env.
    # Kept out of repr, so that no log line or error message can show it.
    api_key: str | None = field(default=None, repr=False)
    protocol: str = "http"  # or grpc: V2 ModelInfer with tensors
    model: str = ""  # grpc: the V2 model name

    @property
    def endpoint(self) -> str:
        if self.url is None:
            raise PipelineError(f"stage {self.name}: {self.url_env} is not set")
        return self.url.rstrip("/") + self.path


@dataclass(frozen=True)
class PipelineSpec:
    source: str
    name: str
    version: str
    kind: str
    aggregate: str
    score_field: str
    readiness: bool
    pool_size: int
    input_schema: dict[str, Any] | None
    stages: tuple[StageSpec, ...]

    def unset(self) -> list[str]:
        """The stages' URL and key variables that are not set."""
        urls = [stage.url_env for stage in self.stages if stage.url is None]
        keys = [s.key_env for s in self.stages if s.key_env is not None and s.api_key is None]
        return urls + keys


def read(path: Path, environ: Mapping[str, str]) -> PipelineSpec:
    """Parse and validate ``path``; stage URLs come from ``environ`` (unset ones stay None:
    ``serving-core check`` can still load the file; serving refuses them)."""
    source = str(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PipelineError(f"{source}: cannot be read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise PipelineError(f"{source}: not valid YAML: {exc}") from exc
    return parse(raw, source, environ, default_name=path.parent.name)


def parse(
    raw: Any, source: str, environ: Mapping[str, str], *, default_name: str = "pipeline"
) -> PipelineSpec:
    def fail(key: str, why: str) -> PipelineError:
        return PipelineError(f"{source}: {key}: {why}")

    if not isinstance(raw, dict):
        raise PipelineError(f"{source}: must be a YAML mapping with at least `kind` and `stages`")
    no_unknown(raw, _TOP_KEYS, "", fail)
    kind = raw.get("kind")
    if kind not in KINDS:
        raise fail("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    aggregate = raw.get("aggregate", "all")
    if aggregate not in AGGREGATES:
        raise fail("aggregate", f"must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    if kind == "serial" and "aggregate" in raw:
        raise fail("aggregate", "only a parallel pipeline aggregates; remove it, or kind: parallel")
    schema = _schema(raw.get("input_schema"), fail)
    stages_raw = raw.get("stages")
    if not isinstance(stages_raw, list) or not stages_raw:
        raise fail("stages", "must be a non-empty list of stages")
    stages = tuple(_stage(one, f"stages[{i}]", environ, fail) for i, one in enumerate(stages_raw))
    names = [stage.name for stage in stages]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise fail(f"stages[{i}].name", f"{name!r} is used twice; stage names must differ")
    if kind == "parallel":
        for i, stage in enumerate(stages):
            if stage.into is not None:
                raise fail(f"stages[{i}].into", "only serial stages feed the next one")
    return PipelineSpec(
        source=source,
        name=text(raw.get("name", default_name), "name", fail),
        version=text(raw.get("version", "1"), "version", fail),
        kind=kind,
        aggregate=aggregate,
        score_field=text(raw.get("score_field", "probability"), "score_field", fail),
        readiness=flag(raw.get("readiness", False), "readiness", fail),
        pool_size=count(raw.get("pool_size", 64), "pool_size", fail, least=1),
        input_schema=schema,
        stages=stages,
    )


def _schema(schema: Any, fail: Fail) -> dict[str, Any] | None:
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise fail("input_schema", "must be a JSON Schema mapping")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise fail("input_schema", f"not a valid JSON Schema: {exc.message}") from exc
    return schema


def _stage(raw: Any, key: str, environ: Mapping[str, str], fail: Fail) -> StageSpec:
    if not isinstance(raw, dict):
        raise fail(key, "must be a mapping with at least `name` and `url_env` (or `grpc_env`)")
    no_unknown(raw, _STAGE_KEYS, f"{key}.", fail)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise fail(f"{key}.name", f"must be a short name (letters, digits, _ . -), got {name!r}")
    if "grpc_env" in raw:
        return _grpc_stage(raw, key, name, environ, fail)
    if "model" in raw:
        raise fail(f"{key}.model", "only a gRPC stage names its model; add grpc_env, or remove it")
    url_env = env_name(raw.get("url_env"), f"{key}.url_env", f"{name}_URL", fail)
    url = environ.get(url_env) or None
    if url is not None and not re.match(r"https?://[^/\s]+", url):
        raise fail(
            f"{key}.url_env",
            f"{url_env}={url!r} is not an http(s) base URL; set it like http://host:8000",
        )
    path = raw.get("path", "/predict")
    if not isinstance(path, str) or not path.startswith("/"):
        raise fail(f"{key}.path", f"must start with '/', got {path!r}")
    return StageSpec(
        name=name, url_env=url_env, url=url, path=path, **_common(raw, key, environ, fail)
    )


def _grpc_stage(
    raw: dict[str, Any], key: str, name: str, environ: Mapping[str, str], fail: Fail
) -> StageSpec:
    for http_only in ("url_env", "path"):
        if http_only in raw:
            raise fail(
                f"{key}.{http_only}",
                "a stage is HTTP (url_env) or gRPC (grpc_env), not both; remove one",
            )
    grpc_env = env_name(raw.get("grpc_env"), f"{key}.grpc_env", f"{name}_GRPC", fail)
    target = environ.get(grpc_env) or None
    if target is not None and not re.fullmatch(r"[^/\s:]+:\d{1,5}", target):
        raise fail(
            f"{key}.grpc_env",
            f"{grpc_env}={target!r} is not host:port; set it like ids:8001 (no scheme, no path)",
        )
    if "model" not in raw:
        raise fail(f"{key}.model", "a gRPC stage names the V2 model it calls; add model: <name>")
    model = text(raw["model"], f"{key}.model", fail)
    return StageSpec(
        name=name,
        url_env=grpc_env,
        url=target,
        path="",
        protocol="grpc",
        model=model,
        **_common(raw, key, environ, fail),
    )


def _common(
    raw: dict[str, Any], key: str, environ: Mapping[str, str], fail: Fail
) -> dict[str, Any]:
    """The keys an HTTP and a gRPC stage share, as StageSpec's fields."""
    name = raw["name"]
    key_env = raw.get("key_env")
    if key_env is not None:
        # SERVING_API_KEYS is the keys this service accepts, not what a stage wants.
        key_env = env_name(key_env, f"{key}.key_env", f"{name}_API_KEY", fail)
    api_key = environ.get(key_env) if key_env is not None else None
    if api_key is not None and (not api_key.strip() or any(c.isspace() for c in api_key.strip())):
        raise fail(f"{key}.key_env", f"{key_env} must hold one key with no spaces")
    timeout = raw.get("timeout_s", 2.0)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (0 < timeout < math.inf)
    ):
        raise fail(f"{key}.timeout_s", f"must be a positive number of seconds, got {timeout!r}")
    into = raw.get("into")
    if into is not None:
        into = text(into, f"{key}.into", fail)
    return {
        "timeout_s": float(timeout),
        "optional": flag(raw.get("optional", False), f"{key}.optional", fail),
        "retries": count(raw.get("retries", 2), f"{key}.retries", fail, least=0),
        "label": text(raw.get("label", name), f"{key}.label", fail),
        "into": into,
        "key_env": key_env,
        "api_key": api_key.strip() if api_key else None,
    }
