"""values.schema.json: it refuses a bad value naming the key, closes every object it
defines, and has exactly the keys of values.yaml, where each is documented."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest

from tests.deploy.chart import (
    CHART,
    lint_errors,
    tagged,
)

# --- bad values are refused with a readable message ----------------------------

BAD_VALUES = [
    ({"replicaCount": "three"}, "at '/replicaCount': got string, want integer"),
    ({"serving": {"maxBatchSize": "16"}}, "at '/serving/maxBatchSize': got string, want integer"),
    ({"serving": {"requestTimeoutSeconds": 0}}, "at '/serving/requestTimeoutSeconds'"),
    ({"serving": {"batchPolicy": "greedy"}}, "at '/serving/batchPolicy'"),
    ({"serving": {"device": "gpu"}}, "at '/serving/device'"),
    ({"serving": {"dtype": "int8"}}, "at '/serving/dtype'"),
    ({"autoscaling": {"enabled": "yes"}}, "at '/autoscaling/enabled': got string, want boolean"),
    ({"replicas": 3}, "additional properties 'replicas' not allowed"),
    (
        {"serving": {"maxBatchsize": 8}},
        "at '/serving': additional properties 'maxBatchsize' not allowed",
    ),
    ({"serving": {"cacheUrl": "http://redis:6379"}}, "at '/serving/cacheUrl'"),
    (
        {"serving": {"cacheUrlSecret": {"nmae": "redis"}}},
        "at '/serving/cacheUrlSecret': additional properties 'nmae' not allowed",
    ),
    ({"serving": {"cacheSize": -1}}, "at '/serving/cacheSize'"),
    ({"batch": {"completion": 4}}, "at '/batch': additional properties 'completion' not allowed"),
    ({"batch": {"completions": 0}}, "at '/batch/completions'"),
    ({"batch": {"concurrencyPolicy": "Skip"}}, "at '/batch/concurrencyPolicy'"),
    ({"batch": {"schedule": "nightly"}}, "at '/batch/schedule'"),
    ({"batch": {"args": ["--input", 3]}}, "at '/batch/args/1': got number, want string"),
    ({"worker": {"enable": True}}, "at '/worker': additional properties 'enable' not allowed"),
    ({"worker": {"queue": "{minilm}"}}, "at '/worker/queue'"),
    ({"worker": {"port": 80}}, "at '/worker/port'"),
    ({"worker": {"keda": {"address": "redis://r:6379/0"}}}, "at '/worker/keda/address'"),
    ({"worker": {"keda": {"streamLength": 0}}}, "at '/worker/keda/streamLength'"),
    (
        {"worker": {"keda": {"passwordFromEnv": "REDIS-PASSWORD"}}},
        "at '/worker/keda/passwordFromEnv'",
    ),
    ({"serving": {"jobsEnabled": "yes"}}, "at '/serving/jobsEnabled'"),
    ({"nginx": {"image": {"tag": 1.25}}}, "at '/nginx/image/tag': got number, want string"),
    # Kubernetes' quantity, not the nginx size the entrypoint reads.
    ({"nginx": {"bodySpoolSize": "128Mi"}}, "at '/nginx/bodySpoolSize'"),
    ({"nginx": {"bodySpoolSize": -1}}, "at '/nginx/bodySpoolSize'"),
    # Kubernetes' decimal kilo is k: the API server refuses 256K.
    ({"tmpSizeLimit": "256K"}, "at '/tmpSizeLimit'"),
    (
        {"tolerations": [{"key": "nvidia.com/gpu", "opertor": "Exists"}]},
        "at '/tolerations/0': additional properties 'opertor' not allowed",
    ),
    ({"extraVolumeMounts": [{"name": "model"}]}, "at '/extraVolumeMounts/0'"),
    (
        {"networkPolicy": {"metricsFrom": [{"namespaceSelecter": {}}]}},
        "at '/networkPolicy/metricsFrom/0'",
    ),
    ({"probes": {"liveness": {"timeoutSeconds": 1}}}, "at '/probes/liveness/timeoutSeconds'"),
    (
        {"pipeline": {"stageUrls": {"STAGE-URL": "http://stage"}}},
        "at '/pipeline/stageUrls': additional properties 'STAGE-URL' not allowed",
    ),
    (
        {"pipeline": {"stageUrls": {"STAGE_URL": "stage:8000"}}},
        "at '/pipeline/stageUrls/STAGE_URL'",
    ),
    ({"pipeline": {"stages": {}}}, "at '/pipeline': additional properties 'stages' not allowed"),
    (
        {"networkPolicy": {"egress": [{"ports": [{"port": 6379, "protocol": "tcp"}]}]}},
        "at '/networkPolicy/egress/0/ports/0/protocol'",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES)
def test_schema_refuses_bad_values_naming_the_key(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.render(tagged(values), name="demo", namespace="serving")
    assert "values don't meet the specifications of the schema" in str(refused.value)
    assert message in str(refused.value)
    assert any(message in error for error in lint_errors(tagged(values)))


# Kubernetes' own fields (probe timing, resource requests and limits), documented by
# the object they belong to.
KUBERNETES_FIELDS = {
    "periodSeconds",
    "timeoutSeconds",
    "failureThreshold",
    "successThreshold",
    "requests",
    "limits",
}


def test_every_chart_value_is_documented_in_values_yaml(chart: helm.Chart) -> None:
    schema = chart.schema
    assert schema is not None
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    stack: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z]\w*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [key for _, key in stack] + [match.group(2)]
        stack.append((indent, match.group(2)))
        node: dict[str, Any] | None = schema
        for key in path:
            node = (node or {}).get("properties", {}).get(key)
        if node is None or path[-1] in KUBERNETES_FIELDS:
            continue  # inside a Kubernetes object (resources, strategy ...)
        if not lines[number - 1].lstrip().startswith("#"):
            undocumented.append(".".join(path))
    assert undocumented == []


# Kubernetes objects the schema only partly describes: a TopologySpreadConstraint's
# many optional fields, a Volume's dozens of sources; and Helm's `global`, which a
# parent chart shares with all its subcharts, each reading its own keys.
OPEN_OBJECTS = {"topologySpreadConstraints[]", "extraVolumes[]", "global"}


def test_schema_refuses_unknown_keys_in_every_object_it_defines(chart: helm.Chart) -> None:
    open_objects = []

    def walk(node: dict[str, Any], path: str) -> None:
        if (
            "properties" in node
            and path not in OPEN_OBJECTS
            and node.get("additionalProperties") is not False
        ):
            open_objects.append(path or "<top>")
        for key, child in node.get("properties", {}).items():
            walk(child, f"{path}.{key}".lstrip("."))
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    schema = chart.schema
    assert schema is not None
    walk(schema, "")
    for name, definition in schema.get("definitions", {}).items():
        walk(definition, f"#{name}")
    assert open_objects == []


def test_schema_and_values_yaml_have_the_same_keys(chart: helm.Chart) -> None:
    schema = chart.schema
    assert schema is not None
    assert set(schema["properties"]) == set(chart.values)
    assert schema["additionalProperties"] is False
