"""The chart's stream worker: `serving-core stream` as a Deployment, scaled by KEDA.

Rendered by Helm's own Go SDK as the rest of the chart (tests/deploy/test_chart_*.py,
whose helpers in tests/deploy/chart.py this module shares), validated against
Kubernetes' schemas and, for the ScaledObjects, against KEDA's own CRD
(tests/deploy/keda/).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from serving_core.settings import PREFIX, Settings
from serving_core.stream import brokers
from serving_core.stream.kafka import config as kafka_config
from serving_core.stream.kafka.source import SOURCE_DEFAULTS
from tests.deploy.chart import (
    CHART,
    KUBE_VERSIONS,
    MONITORING,
    POD_KNOBS,
    STREAM_SETTINGS,
    VALUE_SETS,
    containers,
    env_of,
    find,
    is_subset,
    lint_errors,
    render,
    serving_env,
    tagged,
    validate,
)
from tests.deploy.keda_crd import SCALED_OBJECT
from tests.servers import ROOT

PASSWORD = "s3cret-pw"
AMQP = f"amqp://serving:{PASSWORD}@rabbitmq.stream.svc:5672/%2F"
URLS = {
    "source": f"{AMQP}?queue=sentences",
    "sink": f"{AMQP}?exchange=&routing_key=embeddings",
    "deadLetter": f"{AMQP}?exchange=&routing_key=sentences.dead",
}
SECRETS = {
    "sourceSecret": {"name": "stream-urls", "key": "source"},
    "sinkSecret": {"name": "stream-urls", "key": "sink"},
    "deadLetterSecret": {"name": "stream-urls", "key": "dead-letter"},
}


def with_stream(values: dict[str, Any] | None = None, **stream: Any) -> dict[str, Any]:
    """``values`` with the stream worker on over plain RabbitMQ URLs (unless given), and a tag."""
    values = tagged(values or {})
    given = values.get("stream", {}) | stream
    urls = {} if any(key.endswith("Secret") for key in given) else URLS
    values["stream"] = {"enabled": True, **urls, **given}
    return values


def stream_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = find(docs, "Deployment", "stream")["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def trigger(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = find(docs, "ScaledObject", "stream")["spec"]["triggers"]
    return only  # type: ignore[no-any-return]


def rendered_text(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    return chart.render(values, name="demo", namespace="serving")  # type: ignore[no-any-return]


# --- the Deployment ------------------------------------------------------------------


def test_stream_is_off_by_default(chart: helm.Chart) -> None:
    docs = render(chart, tagged({}))
    components = {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in docs}
    assert not components & {"stream", "stream-metrics"}
    assert not [
        e
        for c in containers(find(docs, "Deployment")).values()
        for e in c.get("env", [])
        if e["name"].startswith("SERVING_STREAM_")
    ]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_stream_deployment_renders_valid_and_runs_serving_core_stream(
    chart: helm.Chart, kube_version: str
) -> None:
    assert lint_errors(VALUE_SETS["values-stream"], kube_version) == []
    docs = render(chart, VALUE_SETS["values-stream"])
    validate(docs, kube_version)
    deployment = find(docs, "Deployment", "stream")
    assert deployment["metadata"]["name"] == "demo-serving-core-stream"
    pod = deployment["spec"]["template"]
    # No nginx: nothing but the kubelet and Prometheus calls it.
    assert [c["name"] for c in pod["spec"]["containers"]] == ["stream"]
    container = stream_container(docs)
    assert container["command"] == ["serving-core", "stream"]
    assert container["image"] == containers(find(docs, "Deployment"))["app"]["image"]
    # Its own pods: only its metrics Service selects them.
    labels = pod["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "stream"
    for service in (d for d in docs if d["kind"] == "Service"):
        selects = service["spec"]["selector"].items() <= labels.items()
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        assert selects == (component == "stream-metrics"), service["metadata"]["name"]
    # KEDA owns the replica count.
    assert "replicas" not in deployment["spec"]


def test_stream_settings_reach_its_container_as_serving_stream_env(chart: helm.Chart) -> None:
    values = with_stream(
        {"serving": {"handler": "handlers/minilm/handler.py", "maxBatchSize": 24}},
        maxAttempts=5,
        workers=3,
        port=9191,
    )
    docs = render(chart, values)
    stream, app = stream_container(docs), containers(find(docs, "Deployment"))["app"]
    env = env_of(stream)
    assert {key: env[var] for key, var in STREAM_SETTINGS.items()} == URLS | {"maxAttempts": "5"}
    assert (env["SERVING_WORKERS"], env["SERVING_BIND"]) == ("3", "0.0.0.0:9191")
    # The rest is the server's: the same handler, batch size and settings.
    own = {*STREAM_SETTINGS.values(), "SERVING_BIND", "SERVING_WORKERS"}
    assert [e for e in stream["env"] if e["name"] not in own] == [
        e for e in app["env"] if e["name"] not in own
    ]
    # Only the stream container gets them.
    assert not [name for name in env_of(app) if name.startswith("SERVING_STREAM_")]
    assert stream["securityContext"] == app["securityContext"]
    assert stream["resources"] == app["resources"]
    settings = Settings.from_env(serving_env(stream), cores=2)
    assert settings.stream_source == URLS["source"]
    assert settings.stream_max_attempts == 5


def test_stream_urls_from_secrets_are_references_never_values(chart: helm.Chart) -> None:
    values = with_stream(**SECRETS)
    docs = render(chart, values)
    stream = stream_container(docs)
    by_name = {e["name"]: e for e in stream["env"]}
    for key, var in STREAM_SETTINGS.items():
        if key == "maxAttempts":
            continue
        assert by_name[var] == {
            "name": var,
            "valueFrom": {"secretKeyRef": SECRETS[f"{key}Secret"]},
        }
    # With plain URLs the password is in the stream container's env (the values
    # hold it already) and nowhere else: not in the server's pods, not in KEDA's.
    plain = with_stream(keda={"enabled": True, "hostFromEnv": "RABBITMQ_HOST"})
    for path, text in rendered_text(chart, plain).items():
        assert (PASSWORD in text) == path.endswith("/stream.yaml"), path
    in_stream = [
        e["name"]
        for e in stream_container(render(chart, plain))["env"]
        if PASSWORD in e.get("value", "")
    ]
    assert sorted(in_stream) == sorted(v for k, v in STREAM_SETTINGS.items() if k in URLS)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_stream_pods_take_the_pod_knobs_metrics_service_and_network_policy(
    chart: helm.Chart, kube_version: str
) -> None:
    values = with_stream(
        POD_KNOBS
        | {
            "networkPolicy": {"enabled": True, "metricsFrom": [MONITORING]},
            "metrics": {"serviceMonitor": {"enabled": True}},
        },
        port=9191,
    )
    docs = render(chart, values)
    validate(docs, kube_version)
    deployment = find(docs, "Deployment", "stream")
    pod = deployment["spec"]["template"]
    for key in ("nodeSelector", "tolerations", "affinity", "runtimeClassName", "priorityClassName"):
        assert pod["spec"][key] == POD_KNOBS[key], key
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    stream = stream_container(docs)
    assert stream["env"][-2:] == POD_KNOBS["extraEnv"]
    assert stream["ports"] == [{"name": "metrics", "containerPort": 9191, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert stream[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe
    service = find(docs, "Service", "stream-metrics")
    assert service["metadata"]["name"] == "demo-serving-core-stream-metrics"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9191, "targetPort": "metrics", "protocol": "TCP"}
    ]
    monitor = find(docs, "ServiceMonitor", "stream")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    policy = find(docs, "NetworkPolicy", "stream")
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert policy["spec"]["ingress"] == [
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [MONITORING]}
    ]


def test_stream_grace_period_covers_the_batch_in_hand(chart: helm.Chart) -> None:
    def grace(values: dict[str, Any]) -> int:
        deployment = find(render(chart, values), "Deployment", "stream")
        return deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]  # type: ignore[no-any-return]

    assert grace(with_stream({"serving": {"gracefulTimeoutSeconds": 20.5}})) == 21 + 5
    assert grace(with_stream(terminationGracePeriodSeconds=120)) == 120


def test_without_keda_the_stream_replica_count_applies(chart: helm.Chart) -> None:
    docs = render(chart, with_stream(replicaCount=3))
    assert find(docs, "Deployment", "stream")["spec"]["replicas"] == 3
    assert "ScaledObject" not in {d["kind"] for d in docs}


def test_stream_names_fit_what_kubernetes_allows(chart: helm.Chart) -> None:
    values = with_stream(keda={"enabled": True, "hostFromEnv": "RABBITMQ_HOST"})
    docs = render(chart, values, name="a-very-long-release-name-for-a-sentence-embedding-service")
    names = [
        d["metadata"]["name"]
        for d in docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component")
        in ("stream", "stream-metrics")
    ]
    assert len(names) == 3
    assert all(len(name) <= 63 for name in names), names


# --- KEDA: rabbitmq for an amqp:// source, redis-streams for a redis:// one ---------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_examples_rabbitmq_trigger_scales_on_the_queue_length(
    chart: helm.Chart, kube_version: str
) -> None:
    docs = render(chart, VALUE_SETS["values-stream"])
    validate(docs, kube_version)
    spec = find(docs, "ScaledObject", "stream")["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": find(docs, "Deployment", "stream")["metadata"]["name"],
        "envSourceContainerName": "stream",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 20)
    rabbitmq = trigger(docs)
    assert rabbitmq == {
        "type": "rabbitmq",
        "metadata": {
            "protocol": "amqp",
            "mode": "QueueLength",
            "queueName": "sentences",
            "value": "256",
            "activationValue": "0",
            "hostFromEnv": "RABBITMQ_HOST",
        },
    }
    # KEDA reads the variable from the stream container, which takes it from the Secret.
    (host,) = [e for e in stream_container(docs)["env"] if e["name"] == "RABBITMQ_HOST"]
    assert host["valueFrom"]["secretKeyRef"] == {"name": "stream-urls", "key": "host"}


def test_the_examples_source_queue_is_the_one_keda_watches() -> None:
    example = (CHART / "examples" / "values-stream.yaml").read_text()
    (source,) = re.findall(r'--from-literal=source="\$host([^"]+)"', example)
    assert source.endswith("?queue=" + VALUE_SETS["values-stream"]["stream"]["keda"]["queueName"])


def test_a_plain_amqp_source_gives_keda_its_queue(chart: helm.Chart) -> None:
    values = with_stream(
        keda={"enabled": True, "authenticationRef": "rabbitmq-auth", "activationTarget": 5}
    )
    docs = render(chart, values)
    validate(docs, "1.33")
    rabbitmq = trigger(docs)
    assert rabbitmq["metadata"]["queueName"] == "sentences"
    assert rabbitmq["metadata"]["activationValue"] == "5"
    assert "hostFromEnv" not in rabbitmq["metadata"]
    assert rabbitmq["authenticationRef"] == {"name": "rabbitmq-auth"}


@pytest.mark.parametrize(
    ("source", "keda", "expected"),
    [
        (
            "redis://redis.stream.svc:6380/2?stream=sentences",
            {"redisMetric": "pendingEntriesCount"},
            {
                "stream": "sentences",
                "consumerGroup": "serving-core",
                "pendingEntriesCount": "64",
                "address": "redis.stream.svc:6380",
                "databaseIndex": "2",
            },
        ),
        (
            "rediss://redis.example.com?stream=in&group=embedders",
            {"target": 500, "minReplicaCount": 0},
            {
                "stream": "in",
                "consumerGroup": "embedders",
                "lagCount": "500",
                "address": "redis.example.com:6379",
                "databaseIndex": "0",
                "enableTLS": "true",
            },
        ),
    ],
    ids=["pending-entries", "lag-by-default-tls-scale-to-zero"],
)
def test_a_plain_redis_source_gives_keda_its_stream_group_and_address(
    chart: helm.Chart, source: str, keda: dict[str, Any], expected: dict[str, str]
) -> None:
    values = with_stream(source=source, keda={"enabled": True, **keda})
    docs = render(chart, values)
    validate(docs, "1.33")
    redis = trigger(docs)
    assert redis["type"] == "redis-streams"
    expected = {"activationLagCount": "0", "enableTLS": "false"} | expected
    assert redis["metadata"] == expected
    spec = find(docs, "ScaledObject", "stream")["spec"]
    assert spec["minReplicaCount"] == keda.get("minReplicaCount", 1)


def test_a_redis_source_from_a_secret_takes_kedas_values(chart: helm.Chart) -> None:
    values = with_stream(
        {
            "extraEnv": [
                {
                    "name": "REDIS_PASSWORD",
                    "valueFrom": {"secretKeyRef": {"name": "redis", "key": "password"}},
                }
            ]
        },
        **SECRETS,
        keda={
            "enabled": True,
            "broker": "redis",
            "stream": "sentences",
            "consumerGroup": "embedders",
            "address": "redis-master.stream.svc:6379",
            "passwordFromEnv": "REDIS_PASSWORD",
            "databaseIndex": 1,
            "enableTLS": True,
        },
    )
    docs = render(chart, values)
    validate(docs, "1.33")
    assert trigger(docs) == {
        "type": "redis-streams",
        "metadata": {
            "stream": "sentences",
            "consumerGroup": "embedders",
            "lagCount": "64",
            "activationLagCount": "0",
            "address": "redis-master.stream.svc:6379",
            "passwordFromEnv": "REDIS_PASSWORD",
            "databaseIndex": "1",
            "enableTLS": "true",
        },
    }
    assert "REDIS_PASSWORD" in {e["name"] for e in stream_container(docs)["env"]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t["metadata"].update(value=64), "is not of type 'string'"),
        (lambda t: t.update(metadat={}), "Additional properties are not allowed"),
        (lambda t: t.pop("type"), "'type' is a required property"),
        (lambda t: t.update(authenticationRef={}), "'name' is a required property"),
    ],
    ids=["number-in-metadata", "misspelt-field", "no-type", "nameless-auth"],
)
def test_kedas_crd_refuses_a_broken_stream_trigger(
    chart: helm.Chart, change: Any, message: str
) -> None:
    scaled = copy.deepcopy(
        find(render(chart, VALUE_SETS["values-stream"]), "ScaledObject", "stream")
    )
    SCALED_OBJECT.validate(scaled)
    change(scaled["spec"]["triggers"][0])
    with pytest.raises(jsonschema.ValidationError, match=re.escape(message)):
        SCALED_OBJECT.validate(scaled)


# --- KEDA: kafka for a kafka:// or kafkas:// source -------------------------------

KAFKA_BROKERS = "kafka-0.kafka.svc:9093,kafka-1.kafka.svc:9093"
KAFKA = f"kafkas://serving:{PASSWORD}@{KAFKA_BROKERS}"
KAFKA_URLS = {
    "source": f"{KAFKA}/sentences?group=minilm&sasl.mechanism=SCRAM-SHA-512",
    "sink": f"{KAFKA}/embeddings?sasl.mechanism=SCRAM-SHA-512",
    "deadLetter": f"{KAFKA}/sentences.dead?sasl.mechanism=SCRAM-SHA-512",
}
# What the kafka trigger always says unless told otherwise.
KAFKA_DEFAULTS = {
    "consumerGroup": "serving-core",
    "lagThreshold": "64",
    "activationLagThreshold": "0",
    "offsetResetPolicy": "earliest",
    "allowIdleConsumers": "false",
    "limitToPartitionsWithLag": "false",
    "excludePersistentLag": "false",
}


@pytest.mark.parametrize(
    ("source", "keda", "expected"),
    [
        (
            "kafka://kafka-0.kafka.svc:9092,kafka-1.kafka.svc:9092/sentences",
            {},
            {"bootstrapServers": "kafka-0.kafka.svc:9092,kafka-1.kafka.svc:9092"},
        ),
        (
            KAFKA_URLS["source"],
            {"authenticationRef": "kafka-keda", "target": 500, "activationTarget": 10},
            {
                "bootstrapServers": KAFKA_BROKERS,
                "consumerGroup": "minilm",
                "lagThreshold": "500",
                "activationLagThreshold": "10",
                "sasl": "scram_sha512",
                "tls": "enable",
            },
        ),
        (
            # The security properties in the query, as librdkafka names them.
            f"kafka://{KAFKA_BROKERS}/sentences?security.protocol=SASL_SSL"
            f"&sasl.username=serving&sasl.password={PASSWORD}&auto.offset.reset=latest",
            {"authenticationRef": "kafka-keda"},
            {
                "bootstrapServers": KAFKA_BROKERS,
                "offsetResetPolicy": "latest",
                "sasl": "plaintext",
                "tls": "enable",
            },
        ),
        (
            f"kafkas://{KAFKA_BROKERS}/sentences?auto.offset.reset=smallest",
            {"allowIdleConsumers": True, "excludePersistentLag": True},
            {
                "bootstrapServers": KAFKA_BROKERS,
                "allowIdleConsumers": "true",
                "excludePersistentLag": "true",
                "tls": "enable",
            },
        ),
    ],
    ids=["plain-host-list", "scram-over-tls", "sasl-in-the-query", "tls-idle-consumers"],
)
def test_a_plain_kafka_source_gives_keda_its_brokers_topic_group_and_security(
    chart: helm.Chart, source: str, keda: dict[str, Any], expected: dict[str, str]
) -> None:
    values = with_stream(**KAFKA_URLS, keda={"enabled": True, **keda})
    values["stream"]["source"] = source
    docs = render(chart, values)
    validate(docs, "1.33")
    kafka = trigger(docs)
    assert kafka["type"] == "kafka"
    assert kafka["metadata"] == KAFKA_DEFAULTS | {"topic": "sentences"} | expected
    assert kafka.get("authenticationRef") == (
        {"name": keda["authenticationRef"]} if "authenticationRef" in keda else None
    )


def test_a_kafka_password_reaches_the_stream_container_and_nothing_else(
    chart: helm.Chart,
) -> None:
    values = with_stream(**KAFKA_URLS, keda={"enabled": True, "authenticationRef": "kafka-keda"})
    texts = rendered_text(chart, values)
    assert any(path.endswith("/stream-scaledobject.yaml") for path in texts)
    for path, text in texts.items():
        assert (PASSWORD in text) == path.endswith("/stream.yaml"), path
    # The user name neither: KEDA takes both from the TriggerAuthentication.
    assert "serving" not in yaml.safe_dump(trigger(render(chart, values))["metadata"])


def test_a_kafka_source_from_a_secret_takes_kedas_values(chart: helm.Chart) -> None:
    docs = render(chart, VALUE_SETS["values-stream-kafka"])
    for kube_version in KUBE_VERSIONS:
        validate(docs, kube_version)
    keda = VALUE_SETS["values-stream-kafka"]["stream"]["keda"]
    assert trigger(docs) == {
        "type": "kafka",
        "metadata": KAFKA_DEFAULTS
        | {
            "bootstrapServers": keda["bootstrapServers"],
            "topic": "sentences",
            "consumerGroup": "minilm",
            "lagThreshold": "256",
            "sasl": "scram_sha512",
            "tls": "enable",
        },
        "authenticationRef": {"name": "kafka-keda"},
    }
    spec = find(docs, "ScaledObject", "stream")["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 6)


def example_urls(example: str) -> dict[str, str]:
    """The URLs the example's `kubectl create secret` makes, its shell variables expanded."""
    shell = dict(re.findall(r"^#   (\w+)='([^']*)'$", example, re.MULTILINE))
    urls = dict(re.findall(r'--from-literal=([-a-z]+)="([^"]+)"', example))
    return {key: re.sub(r"\$(\w+)", lambda m: shell[m[1]], url) for key, url in urls.items()}


def test_the_kafka_examples_urls_are_what_the_worker_and_keda_take() -> None:
    urls = example_urls((CHART / "examples" / "values-stream-kafka.yaml").read_text())
    assert set(urls) == {"source", "sink", "dead-letter"}
    brokers.check(urls["source"], urls["sink"], urls["dead-letter"])
    source = kafka_config.parse(urls["source"], "a Kafka source")
    keda = VALUE_SETS["values-stream-kafka"]["stream"]["keda"]
    assert (source.topic, source.group) == (keda["topic"], keda["consumerGroup"])
    assert source.config["bootstrap.servers"] == keda["bootstrapServers"]
    assert source.config["security.protocol"] == "SASL_SSL"
    assert source.config["sasl.mechanism"] == "SCRAM-SHA-512"


def test_keda_resets_offsets_as_the_worker_does() -> None:
    # KEDA counts an uncommitted partition's lag by offsetResetPolicy; the worker
    # starts there by auto.offset.reset. The chart's earliest is the worker's default.
    assert SOURCE_DEFAULTS["auto.offset.reset"] == KAFKA_DEFAULTS["offsetResetPolicy"]


# --- refusals -----------------------------------------------------------------------

STREAM_REFUSALS = [
    (
        {"stream": {"enabled": True, "sink": URLS["sink"], "deadLetter": URLS["deadLetter"]}},
        "stream.enabled needs stream.source or stream.sourceSecret.name",
    ),
    (
        {"stream": {"enabled": True, "source": URLS["source"], "deadLetter": URLS["deadLetter"]}},
        "stream.enabled needs stream.sink or stream.sinkSecret.name",
    ),
    (
        {"stream": {"enabled": True, "source": URLS["source"], "sink": URLS["sink"]}},
        "stream.enabled needs stream.deadLetter or stream.deadLetterSecret.name",
    ),
    (
        {"stream": {"source": URLS["source"], "sourceSecret": SECRETS["sourceSecret"]}},
        "stream.source and stream.sourceSecret.name (stream-urls) are both set: keep one",
    ),
    (
        {"stream": {"keda": {"enabled": True}}},
        "stream.keda.enabled scales the stream Deployment: set stream.enabled too",
    ),
    (
        {"stream": {"enabled": True, **SECRETS, "keda": {"enabled": True}}},
        "stream.keda.enabled needs the source's kind, which the chart cannot read from a Secret",
    ),
    (
        {"stream": {"enabled": True, **URLS, "keda": {"enabled": True}}},
        "stream.keda.enabled with a RabbitMQ source needs how KEDA connects",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **SECRETS,
                "keda": {"enabled": True, "broker": "amqp", "hostFromEnv": "RABBITMQ_HOST"},
            }
        },
        "stream.keda.enabled needs the RabbitMQ queue: set stream.keda.queueName",
    ),
    (
        {"stream": {"enabled": True, **SECRETS, "keda": {"enabled": True, "broker": "redis"}}},
        "stream.keda.enabled needs the Redis stream: set stream.keda.stream",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **SECRETS,
                "keda": {"enabled": True, "broker": "redis", "stream": "in"},
            }
        },
        "stream.keda.enabled needs the source's Redis as KEDA reaches it (host:port, not a URL)",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **URLS,
                "source": f"redis://:{PASSWORD}@redis:6379/0?stream=in",
                "keda": {"enabled": True},
            }
        },
        "stream.source carries a password, which KEDA cannot take from the URL",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **URLS,
                "keda": {"enabled": True, "broker": "redis", "address": "redis:6379"},
            }
        },
        "stream.keda.broker is redis, but stream.source is a amqp:// URL",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **URLS,
                "keda": {
                    "enabled": True,
                    "hostFromEnv": "RABBITMQ_HOST",
                    "minReplicaCount": 5,
                    "maxReplicaCount": 2,
                },
            }
        },
        "stream.keda.minReplicaCount (5) is larger than stream.keda.maxReplicaCount (2)",
    ),
    (
        {"extraEnv": [{"name": "SERVING_STREAM_SINK", "value": URLS["sink"]}]},
        "extraEnv sets SERVING_STREAM_SINK, which the chart sets from stream.sink",
    ),
    (
        {"stream": {"enabled": True, **SECRETS, "keda": {"enabled": True, "broker": "kafka"}}},
        "stream.keda.enabled needs the Kafka brokers: set stream.keda.bootstrapServers",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **SECRETS,
                "keda": {"enabled": True, "broker": "kafka", "bootstrapServers": "kafka:9092"},
            }
        },
        "stream.keda.enabled needs the Kafka topic (letters, digits, '.', '_', '-'), not \"\": "
        "set stream.keda.topic",
    ),
    (
        {"stream": {"enabled": True, **KAFKA_URLS, "keda": {"enabled": True}}},
        "stream.keda.enabled with a SASL Kafka source (sasl scram_sha512) needs KEDA's username "
        "and password, which the chart never copies out of a URL or a Secret: set "
        "stream.keda.authenticationRef",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **KAFKA_URLS,
                "source": "kafka://kafka-0:9092,kafka-1/sentences",
                "keda": {"enabled": True},
            }
        },
        "stream.source's brokers (kafka-0:9092,kafka-1) are not HOST:PORT[,HOST:PORT...]: "
        "give each its port",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **KAFKA_URLS,
                "source": f"kafka://serving:{PASSWORD}@kafka:9092",
                "keda": {"enabled": True},
            }
        },
        "stream.source is not kafka[s]://[USER:PASS@]HOST:PORT[,HOST:PORT...]/TOPIC",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **KAFKA_URLS,
                "source": "kafka://kafka:9092/in?auto.offset.reset=error",
                "keda": {"enabled": True},
            }
        },
        "stream.source's auto.offset.reset=error has no KEDA offsetResetPolicy: use earliest",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **KAFKA_URLS,
                "source": "kafka://kafka:9092/in?security.protocol=SASL_SSL&sasl.mechanism=AWS_MSK_IAM",
                "keda": {"enabled": True, "authenticationRef": "kafka-keda"},
            }
        },
        "stream.source's sasl.mechanism=AWS_MSK_IAM has no KEDA sasl mode",
    ),
    (
        {
            "stream": {
                "enabled": True,
                **KAFKA_URLS,
                "source": "kafka://kafka:9092/in",
                "keda": {
                    "enabled": True,
                    "allowIdleConsumers": True,
                    "limitToPartitionsWithLag": True,
                },
            }
        },
        "stream.keda.allowIdleConsumers and stream.keda.limitToPartitionsWithLag are both true",
    ),
]


@pytest.mark.parametrize(("values", "message"), STREAM_REFUSALS)
def test_stream_rules_beyond_the_schema_stop_the_render_saying_what_to_change(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(tagged(values), name="demo", namespace="serving")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"stream": {"source": "http://rabbitmq:15672"}}, "at '/stream/source'"),
        ({"stream": {"enable": True}}, "at '/stream': additional properties 'enable' not allowed"),
        ({"stream": {"maxAttempts": 0}}, "at '/stream/maxAttempts'"),
        ({"stream": {"keda": {"broker": "nats"}}}, "at '/stream/keda/broker'"),
        ({"stream": {"keda": {"bootstrapServers": "kafka"}}}, "at '/stream/keda/bootstrapServers'"),
        ({"stream": {"keda": {"topic": "a topic"}}}, "at '/stream/keda/topic'"),
        ({"stream": {"keda": {"sasl": "PLAIN"}}}, "at '/stream/keda/sasl'"),
        ({"stream": {"keda": {"redisMetric": "streamLength"}}}, "at '/stream/keda/redisMetric'"),
        ({"stream": {"keda": {"hostFromEnv": "RABBITMQ-HOST"}}}, "at '/stream/keda/hostFromEnv'"),
        ({"stream": {"sinkSecret": {"nmae": "x"}}}, "at '/stream/sinkSecret'"),
    ],
)
def test_the_schema_refuses_bad_stream_values_naming_the_key(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        chart.render(tagged(values), name="demo", namespace="serving")


def test_every_stream_setting_is_documented_with_its_variable() -> None:
    values = (CHART / "values.yaml").read_text()
    for key, var in STREAM_SETTINGS.items():
        (doc,) = re.findall(rf"^  ## @param stream\.{key} (.*)$", values, re.MULTILINE)
        assert var in doc, key
    assert yaml.safe_load(values)["stream"]["enabled"] is False
    assert all(var.startswith(PREFIX) for var in STREAM_SETTINGS.values())


def test_the_docs_show_the_examples_values_as_they_are() -> None:
    page = (ROOT / "docs" / "streams.md").read_text()
    (block,) = re.findall(r"```yaml\n(extraEnv:.*?)```", page, re.S)
    assert is_subset(yaml.safe_load(block), VALUE_SETS["values-stream"]) == []
