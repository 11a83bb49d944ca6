"""Rules beyond the schema: the render stops saying what to change."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest

from tests.deploy.chart import (
    DIGEST,
    EMPTY_TAG_MESSAGE,
    JOBS_SECRET,
    QUEUE_URL,
    tagged,
)

TEMPLATE_REFUSALS = [
    ({}, EMPTY_TAG_MESSAGE),
    (
        {"image": {"digest": DIGEST}},
        "the nginx image has no tag: set nginx.image.tag (or image.tag, which it follows)",
    ),
    (
        {"serving": {"maxQueue": 8, "maxBatchSize": 16}},
        "serving.maxQueue (8) is smaller than serving.maxBatchSize (16)",
    ),
    (
        {"extraEnv": [{"name": "SERVING_MAX_BATCH_SIZE", "value": "8"}]},
        "extraEnv sets SERVING_MAX_BATCH_SIZE, which the chart sets from serving.maxBatchSize",
    ),
    (
        {"extraEnv": [{"name": "SERVING_DEVICE", "value": "cuda"}]},
        "extraEnv sets SERVING_DEVICE, which the chart sets from serving.device",
    ),
    (
        {"extraEnv": [{"name": "SERVING_BIND", "value": "0.0.0.0:8000"}]},
        "extraEnv sets SERVING_BIND, which the chart manages",
    ),
    (
        {"extraEnv": [{"name": "SERVING_GRPC_PORT", "value": "8001"}]},
        "extraEnv sets SERVING_GRPC_PORT, which the chart manages",
    ),
    (
        {"grpc": {"enabled": True, "nginxPort": 8080}, "serving": {"workerClass": "gthread"}},
        "grpc.nginxPort (8080) is also nginx.port or nginx.metricsPort",
    ),
    (
        {
            "grpc": {"enabled": True, "nginxPort": 8082},
            "serving": {"workerClass": "gthread"},
            "nginx": {"exporter": {"enabled": True}},
        },
        "nginx.exporter.statusPort (8082) is also grpc.nginxPort",
    ),
    (
        {"extraEnv": [{"name": "SERVING_CACHE_URL", "value": "redis://redis:6379/0"}]},
        "extraEnv sets SERVING_CACHE_URL, which the chart sets from serving.cacheUrl",
    ),
    (
        {"extraEnv": [{"name": "SERVING_CACHE_HOST", "value": "redis"}]},
        "extraEnv sets SERVING_CACHE_HOST, which is not a serving-core setting",
    ),
    (
        {"serving": {"cacheUrl": "redis://r:6379/0", "cacheUrlSecret": {"name": "cache"}}},
        "serving.cacheUrl and serving.cacheUrlSecret.name (cache) are both set: keep one",
    ),
    ({"batch": {"enabled": True}}, "batch.enabled needs batch.args"),
    (
        {"batch": {"enabled": True, "completions": 4, "args": ["--input", "a", "--shards=2"]}},
        "batch.args has --shards=2, but batch.completions (4) shards the input already",
    ),
    (
        {"batch": {"enabled": True, "args": ["--input", "a"], "schedule": "@daily", "runId": "r2"}},
        "batch.runId (r2) names a one-shot Job's run, but batch.schedule (@daily) makes a CronJob",
    ),
    (
        {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
        "autoscaling.minReplicas (5) is larger than autoscaling.maxReplicas (2)",
    ),
    (
        {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 0}},
        "autoscaling.enabled needs a metric",
    ),
    ({"nginx": {"metricsPort": 8080}}, "nginx.port and nginx.metricsPort are both 8080"),
    (
        {"worker": {"enabled": True}},
        "worker.enabled needs a job queue every pod shares: set serving.jobsUrl",
    ),
    (
        {"worker": {"keda": {"enabled": True}}},
        "worker.keda.enabled scales the worker Deployment: set worker.enabled too",
    ),
    (
        {"worker": {"enabled": True, "keda": {"enabled": True}}, "serving": {"jobsUrl": QUEUE_URL}},
        "worker.keda.enabled needs worker.queue, the name of the handler the image runs",
    ),
    (
        {
            "worker": {"enabled": True, "queue": "minilm", "keda": {"enabled": True}},
            "serving": {"jobsUrlSecret": JOBS_SECRET},
        },
        "worker.keda.enabled needs the queue's Redis as KEDA reaches it (host:port, not a URL)",
    ),
    (
        {
            "worker": {"enabled": True, "queue": "minilm", "keda": {"enabled": True}},
            "serving": {"jobsUrl": "redis://:secret@redis:6379/0"},
        },
        "serving.jobsUrl carries a password, which KEDA cannot take from the URL",
    ),
    (
        {
            "worker": {
                "enabled": True,
                "queue": "minilm",
                "keda": {"enabled": True, "minReplicaCount": 5, "maxReplicaCount": 2},
            },
            "serving": {"jobsUrl": QUEUE_URL},
        },
        "worker.keda.minReplicaCount (5) is larger than worker.keda.maxReplicaCount (2)",
    ),
    (
        {"worker": {"keda": {"address": "redis:6379", "addressFromEnv": "REDIS_ADDRESS"}}},
        "worker.keda.address and worker.keda.addressFromEnv are both set: keep one",
    ),
    (
        {"serving": {"apiKeysFile": "/keys/api", "apiKeysSecret": {"name": "keys", "key": "k"}}},
        "serving.apiKeysFile and serving.apiKeysSecret.name (keys) are both set",
    ),
    (
        {"pipeline": {"stageUrls": {"SERVING_STAGE_URL": "http://stage"}}},
        "pipeline.stageUrls sets SERVING_STAGE_URL, but SERVING_* names are serving-core's",
    ),
    (
        {
            "pipeline": {"stageUrls": {"STAGE_URL": "http://stage"}},
            "extraEnv": [{"name": "STAGE_URL", "value": "http://other"}],
        },
        "extraEnv sets STAGE_URL, which pipeline.stageUrls sets too",
    ),
    (
        {
            "pipeline": {"stageUrls": {"STAGE_URL": "http://stage"}},
            "networkPolicy": {"enabled": True},
            "serving": {"cacheUrl": "redis://cache:6379/0", "jobsUrlSecret": JOBS_SECRET},
        },
        "limits the server pods' egress to DNS and the stages, but serving.cacheUrl and "
        "serving.jobsUrl needs Redis: add a rule for it to networkPolicy.egress",
    ),
]


@pytest.mark.parametrize(("values", "message"), TEMPLATE_REFUSALS)
def test_rules_beyond_the_schema_stop_the_render_saying_what_to_change(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    if values and "image" not in values:
        values = tagged(values)
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(values, name="demo", namespace="serving")
