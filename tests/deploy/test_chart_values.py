"""Every value the schema takes changes the render: a walk over the schema's leaves,
each set to a value other than its default."""

from __future__ import annotations

import copy
import json
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    DIGEST,
    POD_KNOBS,
    render,
    tagged,
)

# --- every value the schema accepts changes the render ---------------------------

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
# Kubernetes objects the chart passes through whole: one value each.
WHOLE_OBJECTS = {
    "resources",
    "nginx.resources",
    "nginx.exporter.resources",
    "batch.resources",
    "worker.resources",
    "stream.resources",
    "model.resources",
}
WALK_QUEUE = "redis://redis.queue.svc:6379/0"
WALK_STREAM = {
    "source": "amqp://serving:pw@rabbitmq.stream.svc:5672/%2F?queue=sentences",
    "sink": "amqp://serving:pw@rabbitmq.stream.svc:5672/%2F?exchange=&routing_key=embeddings",
    "deadLetter": "amqp://serving:pw@rabbitmq.stream.svc:5672/%2F?exchange=&routing_key=dead",
}
WALK_REDIS_SOURCE = "redis://redis.stream.svc:6379/0?stream=sentences"
WALK_KAFKA_SOURCE = "kafka://kafka.stream.svc:9092/sentences"
WALK_MODEL_URI = "s3://models/minilm/"
# Values that matter only with others, by path prefix: each leaf under a prefix is
# rendered with these values both before and after it changes (a context that
# sets the leaf to the walk's sample, such as an `enabled`, is left out).
WALK_CONTEXTS: list[tuple[str, dict[str, Any]]] = [
    ("batch.", {"batch": {"enabled": True}}),
    ("batch.", {"batch": {"args": ["--input", "a", "--output", "b"]}}),
    *[
        (f"batch.{key}", {"batch": {"schedule": "@daily"}})
        for key in (
            "timeZone",
            "concurrencyPolicy",
            "startingDeadlineSeconds",
            "successfulJobsHistoryLimit",
            "failedJobsHistoryLimit",
            "suspend",
            "ttlSecondsAfterFinished",
        )
    ],
    ("grpc.", {"serving": {"workerClass": "gthread"}}),
    ("grpc.", {"grpc": {"enabled": True}}),
    ("worker.", {"serving": {"jobsUrl": WALK_QUEUE}}),
    ("worker.", {"worker": {"enabled": True}}),
    ("worker.keda.", {"worker": {"keda": {"enabled": True}}}),
    ("worker.keda.", {"worker": {"queue": "model"}}),
    # The workers consume their handler's queue whatever this says: it names the
    # stream KEDA watches.
    ("worker.queue", {"worker": {"queue": "model", "keda": {"enabled": True}}}),
    *[
        # Only when KEDA's address does not come from a plain serving.jobsUrl.
        (
            f"worker.keda.{key}",
            {
                "serving": {"jobsUrl": "", "jobsUrlSecret": {"name": "jobs"}},
                "worker": {"keda": {"address": "redis.queue.svc:6379"}},
            },
        )
        for key in ("databaseIndex", "enableTLS")
    ],
    ("stream.", {"stream": WALK_STREAM}),
    ("stream.", {"stream": {"enabled": True}}),
    *[
        # A Secret's name and key matter only without the plain URL.
        (f"stream.{key}Secret.", {"stream": {key: "", f"{key}Secret": {"name": "urls"}}})
        for key in ("source", "sink", "deadLetter")
    ],
    ("stream.keda.", {"stream": {"keda": {"hostFromEnv": "RABBITMQ_HOST"}}}),
    ("stream.keda.", {"stream": {"keda": {"enabled": True}}}),
    *[
        # The redis-streams trigger's own values: with a Redis source.
        (f"stream.keda.{key}", {"stream": {"source": WALK_REDIS_SOURCE}})
        for key in ("stream", "consumerGroup", "redisMetric", "address", "passwordFromEnv")
    ],
    *[
        # Only when KEDA's address does not come from a plain redis:// source.
        (
            f"stream.keda.{key}",
            {"stream": {"source": WALK_REDIS_SOURCE, "keda": {"address": "redis:6379"}}},
        )
        for key in ("databaseIndex", "enableTLS")
    ],
    *[
        # The kafka trigger's own values: with a Kafka source (a SASL mode needs the
        # TriggerAuthentication with the credentials).
        (
            f"stream.keda.{key}",
            {"stream": {"source": WALK_KAFKA_SOURCE, "keda": {"authenticationRef": "kafka"}}},
        )
        for key in (
            "bootstrapServers",
            "topic",
            "sasl",
            "allowIdleConsumers",
            "limitToPartitionsWithLag",
            "excludePersistentLag",
        )
    ],
    ("ingress.", {"ingress": {"enabled": True}}),
    # The model's volume and credentials serve the init container that fetches a store's URI.
    ("model.", {"model": {"uri": WALK_MODEL_URI}}),
    ("model.credentials.", {"model": {"credentials": {"secretName": "model-store"}}}),
    ("model.credentials.fileEnv", {"model": {"credentials": {"fileKey": "key.json"}}}),
    # The HTTPRoute attaches to a Gateway; the canary and the mirror are its backends.
    *[
        (prefix, context)
        for prefix in ("rollout.httpRoute.", "rollout.canary.", "rollout.mirror.")
        for context in (
            {"rollout": {"httpRoute": {"parentRefs": [{"name": "gw"}]}}},
            {"rollout": {"httpRoute": {"enabled": True}}},
        )
    ],
    ("rollout.canary.weight", {"rollout": {"canary": {"service": "demo-canary-serving-core"}}}),
    ("rollout.mirror.percent", {"rollout": {"mirror": {"service": "demo-shadow-serving-core"}}}),
    # ingress-nginx's canary annotations go on this release's Ingress.
    (
        "rollout.ingressNginxCanary.",
        {"ingress": {"enabled": True, "controller": "ingress-nginx"}},
    ),
    ("rollout.ingressNginxCanary.", {"rollout": {"ingressNginxCanary": {"enabled": True}}}),
    # A read timeout goes into the named controller's annotations.
    ("ingress.readTimeoutSeconds", {"ingress": {"controller": "contour"}}),
    ("autoscaling.", {"autoscaling": {"enabled": True}}),
    ("autoscaling.podsMetric.", {"autoscaling": {"podsMetric": {"enabled": True}}}),
    ("networkPolicy.", {"networkPolicy": {"enabled": True}}),
    ("metrics.serviceMonitor.", {"metrics": {"serviceMonitor": {"enabled": True}}}),
    ("metrics.grafanaDashboard.", {"metrics": {"grafanaDashboard": {"enabled": True}}}),
    ("metrics.prometheusRule.", {"metrics": {"prometheusRule": {"enabled": True}}}),
    ("serving.cacheUrlSecret.", {"serving": {"cacheUrlSecret": {"name": "cache"}}}),
    ("serving.jobsUrlSecret.", {"serving": {"jobsUrlSecret": {"name": "jobs"}}}),
    ("serving.payloadLogUrlSecret.", {"serving": {"payloadLogUrlSecret": {"name": "events"}}}),
    ("serving.apiKeysSecret.", {"serving": {"apiKeysSecret": {"name": "keys"}}}),
    ("serving.maxRequestsJitter", {"serving": {"maxRequests": 1000}}),
    ("nginx.rateLimit.burst", {"nginx": {"rateLimit": {"requestsPerSecond": 10}}}),
    ("nginx.exporter.", {"nginx": {"exporter": {"enabled": True}}}),
    ("serving.followupQueue", {"serving": {"jobsUrl": WALK_QUEUE}}),
    ("serving.threads", {"serving": {"workerClass": "gthread"}}),
    ("serving.workerConnections", {"serving": {"workerClass": "gevent"}}),
    ("extraVolumeMounts", {"extraVolumes": [{"name": "model", "emptyDir": {}}]}),
    ("batch.extraVolumeMounts", {"batch": {"extraVolumes": [{"name": "out", "emptyDir": {}}]}}),
    # Every otel value is in the variables of an enabled block only.
    ("otel.", {"otel": {"enabled": True}}),
    ("otel.", {"otel": {"endpoint": "http://otel-collector.observability:4318"}}),
    ("otel.samplerArg", {"otel": {"sampler": "parentbased_traceidratio"}}),
    ("otel.headersSecret.", {"otel": {"headersSecret": {"name": "otlp"}}}),
]
# A value the schema takes, other than the default, where the walk cannot make one
# up from the type (strings, lists, objects).
WALK_SAMPLES: dict[str, Any] = {
    "nameOverride": "model",
    "fullnameOverride": "model-server",
    "global.imageRegistry": "mirror.example.com",
    "serving.modelRevision": "sha256:0123abcd",
    "global.imagePullSecrets": ["mirror"],
    "image.repository": "ghcr.io/acme/app",
    "image.tag": "1.2.3",
    "image.digest": DIGEST,
    "imagePullSecrets": [{"name": "ghcr"}],
    "serving.handler": "handlers/echo/handler.py",
    "serving.trustedProxies": ["10.0.0.0/8"],
    "serving.device": "cuda",
    "serving.maxQueue": 64,
    "serving.cacheUrl": "redis://cache:6379/0",
    "serving.cacheUrlSecret.name": "cache",
    "serving.jobsUrlSecret.name": "jobs",
    "serving.payloadLogUrl": "https://monitor.example.com/events",
    "serving.payloadLogUrlSecret.name": "events",
    "serving.payloadLogUrlSecret.key": "address",
    "serving.payloadLogRedact": ["email"],
    "serving.apiKeysSecret.name": "keys",
    "lifecycle.terminationGracePeriodSeconds": 120,
    "serving.cacheUrlSecret.key": "address",
    "serving.jobsUrl": WALK_QUEUE,
    "serving.jobsUrlSecret.key": "address",
    "serving.jobsPath": "/tmp/jobs.db",
    "serving.followupQueue": "next-model",
    "serving.apiKeys": "key-1",
    "serving.apiKeysFile": "/run/keys",
    "serving.apiKeysSecret.key": "api-keys",
    "serving.corsOrigins": ["https://app.example.com"],
    "pipeline.stageUrls": {"PREP_URL": "http://prep:8000"},
    "extraEnv": [{"name": "HF_HOME", "value": "/models"}],
    "envFrom": [{"configMapRef": {"name": "env"}}],
    "strategy": {"type": "Recreate"},
    "resources": {"limits": {"cpu": "4", "memory": "2Gi"}},
    "nginx.image.repository": "ghcr.io/acme/nginx",
    "nginx.image.tag": "1.2.4",
    "nginx.image.digest": DIGEST,
    "nginx.workerProcesses": "auto",
    "nginx.upstreamMaxConns": 500,
    "nginx.bodySpoolSize": "64m",
    "nginx.resources": {"limits": {"memory": "256Mi"}},
    "nginx.trustedProxies": ["10.0.0.0/8"],
    "nginx.exporter.image.repository": "ghcr.io/nginx/nginx-prometheus-exporter",
    "nginx.exporter.image.tag": "1.5.0",
    "nginx.exporter.image.digest": DIGEST,
    "nginx.exporter.resources": {"limits": {"memory": "64Mi"}},
    "service.annotations": {"example.com/lb": "internal"},
    "ingress.className": "nginx",
    "ingress.readTimeoutSeconds": 600,
    "ingress.annotations": {"example.com/tls": "yes"},
    "ingress.hosts": [{"host": "a.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
    "ingress.tls": [{"secretName": "tls", "hosts": ["a.example.com"]}],
    "autoscaling.podsMetric.name": "serving_in_flight",
    "autoscaling.podsMetric.averageValue": "4",
    "autoscaling.behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
    "podDisruptionBudget.maxUnavailable": "50%",
    "serviceAccount.name": "model",
    "serviceAccount.annotations": {"example.com/role": "reader"},
    "metrics.serviceMonitor.interval": "15s",
    "metrics.serviceMonitor.scrapeTimeout": "5s",
    "metrics.serviceMonitor.labels": {"release": "kps"},
    "metrics.grafanaDashboard.labels": {"grafana_dashboard": "2"},
    "metrics.prometheusRule.labels": {"release": "kps"},
    "metrics.prometheusRule.runbookBaseUrl": "https://runbooks.example.com/serving-core",
    "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 20001},
    "securityContext": {"runAsUser": 20002},
    "tmpSizeLimit": "1Gi",
    "podAnnotations": {"example.com/owner": "ml"},
    "podLabels": {"team": "ml"},
    "priorityClassName": "serving-high",
    "nodeSelector": {"kubernetes.io/arch": "arm64"},
    "tolerations": [{"key": "spot", "operator": "Exists"}],
    "affinity.nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
        }
    },
    "affinity.podAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 1,
                "podAffinityTerm": {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"app": "cache"}},
                },
            }
        ]
    },
    "affinity.podAntiAffinity": POD_KNOBS["affinity"]["podAntiAffinity"],
    "topologySpreadConstraints": POD_KNOBS["topologySpreadConstraints"],
    "networkPolicy.apiFrom": [{"podSelector": {"matchLabels": {"app": "client"}}}],
    "networkPolicy.metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "mon"}}}],
    "networkPolicy.egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}],
    "runtimeClassName": "nvidia",
    "extraVolumes": [{"name": "model", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "model", "mountPath": "/models"}],
    "batch.args": ["--input", "c", "--output", "d"],
    "batch.schedule": "0 2 * * *",
    "batch.runId": "2026-12-01",
    "batch.timeZone": "Europe/Berlin",
    "batch.podFailurePolicy": {"rules": []},
    "batch.resources": {"limits": {"cpu": "8"}},
    "batch.extraVolumes": [{"name": "out", "emptyDir": {}}],
    "batch.extraVolumeMounts": [{"name": "out", "mountPath": "/out"}],
    "worker.queue": "other-model",
    "worker.resources": {"limits": {"cpu": "8"}},
    "worker.keda.address": "redis.other.svc:6379",
    "worker.keda.addressFromEnv": "REDIS_ADDRESS",
    "worker.keda.usernameFromEnv": "REDIS_USER",
    "worker.keda.passwordFromEnv": "REDIS_PASSWORD",
    "worker.keda.authenticationRef": "redis-auth",
    "stream.source": "amqp://serving:pw@rabbitmq.other.svc:5672/%2F?queue=other",
    "stream.sourceSecret.name": "stream-urls",
    "stream.sourceSecret.key": "in",
    "stream.sink": "redis://redis.stream.svc:6379/0?stream=embeddings",
    "stream.sinkSecret.name": "stream-urls",
    "stream.sinkSecret.key": "out",
    "stream.deadLetter": "redis://redis.stream.svc:6379/0?stream=dead",
    "stream.deadLetterSecret.name": "stream-urls",
    "stream.deadLetterSecret.key": "dead",
    "stream.resources": {"limits": {"cpu": "8"}},
    "stream.keda.queueName": "other-queue",
    "stream.keda.hostFromEnv": "AMQP_URL",
    "stream.keda.stream": "other-stream",
    "stream.keda.consumerGroup": "other-group",
    "stream.keda.address": "redis.other.svc:6379",
    "stream.keda.passwordFromEnv": "REDIS_PASSWORD",
    "stream.keda.authenticationRef": "rabbitmq-auth",
    "stream.keda.bootstrapServers": "kafka-0.other.svc:9092,kafka-1.other.svc:9092",
    "stream.keda.topic": "other-topic",
    "model.uri": WALK_MODEL_URI,
    "model.mountPath": "/models",
    "model.volume.sizeLimit": "4Gi",
    "model.volume.claimName": "models",
    "model.credentials.secretName": "model-store",
    "model.credentials.env": {"AWS_ACCESS_KEY_ID": "access-key-id"},
    "model.credentials.fileKey": "key.json",
    "model.credentials.fileEnv": "GCP_KEY_FILE",
    "model.extraEnv": [{"name": "AWS_REGION", "value": "eu-west-1"}],
    "model.resources": {"limits": {"cpu": "1"}},
    "rollout.httpRoute.parentRefs": [{"name": "public", "namespace": "gateway-system"}],
    "rollout.httpRoute.hostnames": ["serving.example.com"],
    "rollout.httpRoute.pathPrefix": "/v1",
    "rollout.httpRoute.annotations": {"example.com/owner": "ml"},
    "rollout.httpRoute.requestTimeoutSeconds": 600,
    "rollout.canary.service": "demo-canary-serving-core",
    "rollout.mirror.service": "demo-shadow-serving-core",
    "rollout.ingressNginxCanary.header": "X-Canary",
    "otel.endpoint": "http://jaeger.tracing:4318",
    "otel.samplerArg": "0.25",
    "otel.serviceName": "minilm",
    "otel.environment": "staging",
    "otel.resourceAttributes": {"team": "search"},
    "otel.headersSecret.name": "otlp-backend",
    "otel.headersSecret.key": "api-headers",
    "otel.extraEnv": [{"name": "OTEL_BSP_MAX_QUEUE_SIZE", "value": "4096"}],
}
# Leaves that change nothing by themselves, with the reason.
WALK_EXCEPTIONS: dict[str, str] = {
    "otel.protocol": "http/protobuf is its one value: the image ships the OTLP/HTTP exporter only",
    "stream.keda.broker": "a plain stream.source's scheme names the broker already, and with "
    "sourceSecret the chart refuses to render without it (test_chart_stream.py)",
}


def resolved(node: dict[str, Any]) -> dict[str, Any]:
    """``node``, or the schema node its $ref names."""
    while "$ref" in node:
        target = SCHEMA
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def schema_leaves(node: dict[str, Any], path: str = "") -> list[str]:
    """The paths of every value the schema describes: its leaves, whole objects as one."""
    node = resolved(node)
    children = node.get("properties", {})
    if not children or path in WHOLE_OBJECTS:
        return [path]
    return [
        leaf
        for key, child in children.items()
        for leaf in schema_leaves(child, f"{path}.{key}".lstrip("."))
    ]


def at(values: Any, path: str) -> Any:
    for key in path.split("."):
        values = values.get(key) if isinstance(values, dict) else None
    return values


def merged(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``more`` over it, objects merged key by key as Helm merges values."""
    out = copy.deepcopy(base)
    for key, value in more.items():
        if isinstance(value, dict) and value and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def nested(path: str, value: Any) -> dict[str, Any]:
    for key in reversed(path.split(".")):
        value = {key: value}
    return value  # type: ignore[no-any-return]


def sample(path: str, node: dict[str, Any]) -> Any:
    """A value the schema takes for ``path`` that is not its default."""
    if path in WALK_SAMPLES:
        return WALK_SAMPLES[path]
    default = at(DEFAULTS, path)
    kinds = node.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "enum" in node:
        return next(v for v in node["enum"] if v != default)
    if "boolean" in kinds:
        return not default
    if "number" in kinds and 0 < default < 1:
        return default / 2  # a ratio
    if "integer" in kinds or "number" in kinds:
        if "maximum" in node and default + 1 > node["maximum"]:
            return default - 1
        return default + 1
    raise AssertionError(f"{path}: add a value the schema takes to WALK_SAMPLES")


def schema_node(path: str) -> dict[str, Any]:
    node = SCHEMA
    for key in path.split("."):
        node = resolved(node["properties"][key])
    return node


@pytest.mark.parametrize("path", schema_leaves(SCHEMA))
def test_every_value_the_schema_takes_changes_the_render(chart: helm.Chart, path: str) -> None:
    if path in WALK_EXCEPTIONS:
        pytest.skip(WALK_EXCEPTIONS[path])
    base = tagged({})
    value = sample(path, schema_node(path))
    for prefix, context in WALK_CONTEXTS:
        if path.startswith(prefix) and at(context, path) != value:
            base = merged(base, context)
    changed = merged(base, nested(path, value))
    assert at(changed, path) == value
    assert render(chart, changed) != render(chart, base), f"{path}: {value!r} changed nothing"
