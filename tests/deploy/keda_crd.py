"""Vendored CRDs as JSON Schemas: KEDA's ScaledObject (tests/deploy/keda/) and the
Gateway API's HTTPRoute (tests/deploy/gateway/).

The API server checks a custom resource against its CRD's openAPIV3Schema, a
structural OpenAPI v3 schema; with strict field validation (`kubectl apply
--validate=strict`) it also refuses fields the schema does not name, where it
would otherwise prune them without a word. This module turns the schema into
one `jsonschema` checks the same way: each object that lists its properties is
closed (unless it says x-kubernetes-preserve-unknown-fields), the x-kubernetes-*
keys, which JSON Schema does not know, are dropped, and int-or-string fields
become either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_PATH = Path(__file__).parent / "keda" / "keda.sh_scaledobjects.yaml"


def load_crd(path: Path = CRD_PATH) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


def to_json_schema(node: Any) -> Any:
    """An OpenAPI v3 structural schema node as the JSON Schema the API server applies."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: to_json_schema(value)
        for key, value in node.items()
        if not key.startswith("x-kubernetes-") and key != "description"
    }
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_validator(crd: dict[str, Any], version: str) -> jsonschema.Draft4Validator:
    """A validator of the CRD's resources of ``version``, which it must serve."""
    (served,) = [v for v in crd["spec"]["versions"] if v["served"] and v["name"] == version]
    kind = crd["spec"]["names"]["kind"]
    schema = to_json_schema(served["schema"]["openAPIV3Schema"])
    # The CRD names its group and version outside the schema; a resource must carry them.
    schema["properties"]["apiVersion"] = {"const": f"{crd['spec']['group']}/{version}"}
    schema["properties"]["kind"] = {"const": kind}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    # metadata is an ObjectMeta, which the API server checks itself: a name is what
    # a manifest cannot do without.
    schema["properties"]["metadata"] = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 253}},
    }
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def scaled_object_validator(crd: dict[str, Any] | None = None) -> jsonschema.Draft4Validator:
    """A validator of ScaledObjects of the CRD's served storage version, keda.sh/v1alpha1."""
    crd = crd or load_crd()
    assert crd["spec"]["names"]["kind"] == "ScaledObject"
    (version,) = [v["name"] for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    return crd_validator(crd, version)


# KEDA's ScaledObject CRD (tests/deploy/keda/, the schema the API server applies),
# closed as strict field validation closes it (above). Trigger metadata is
# map[string]string there, so a number in it is refused.
SCALED_OBJECT = scaled_object_validator()
# The Gateway API's HTTPRoute CRD, standard channel (tests/deploy/gateway/README.md),
# gateway.networking.k8s.io/v1. Its CEL rules (x-kubernetes-validations) are not
# checked here; tests/deploy/test_chart_rollout.py checks what the chart relies on.
HTTP_ROUTE = crd_validator(
    load_crd(Path(__file__).parent / "gateway" / "gateway.networking.k8s.io_httproutes.yaml"), "v1"
)
# The redis-streams scaler's documented metadata keys (keda.sh/docs/*/scalers/redis-streams).
REDIS_STREAMS_METADATA = {
    "address",
    "host",
    "port",
    "addressFromEnv",
    "hostFromEnv",
    "portFromEnv",
    "usernameFromEnv",
    "passwordFromEnv",
    "stream",
    "consumerGroup",
    "pendingEntriesCount",
    "streamLength",
    "lagCount",
    "activationLagCount",
    "enableTLS",
    "unsafeSsl",
    "databaseIndex",
}
# The rabbitmq scaler's documented metadata keys (keda.sh/docs/2.17/scalers/rabbitmq-queue).
RABBITMQ_METADATA = {
    "host",
    "hostFromEnv",
    "usernameFromEnv",
    "passwordFromEnv",
    "protocol",
    "mode",
    "value",
    "activationValue",
    "queueName",
    "vhostName",
    "queueLength",
    "useRegex",
    "pageSize",
    "operation",
    "timeout",
    "excludeUnacknowledged",
    "unsafeSsl",
}
# The kafka scaler's documented metadata keys (keda.sh/docs/2.17/scalers/apache-kafka).
KAFKA_METADATA = {
    "bootstrapServers",
    "consumerGroup",
    "topic",
    "lagThreshold",
    "activationLagThreshold",
    "offsetResetPolicy",
    "allowIdleConsumers",
    "scaleToZeroOnInvalidOffset",
    "excludePersistentLag",
    "limitToPartitionsWithLag",
    "version",
    "partitionLimitation",
    "sasl",
    "saslTokenProvider",
    "tls",
    "unsafeSsl",
    "awsRegion",
}
TRIGGER_METADATA = {
    "redis-streams": REDIS_STREAMS_METADATA,
    "rabbitmq": RABBITMQ_METADATA,
    "kafka": KAFKA_METADATA,
}
