"""The chart's scheme lists are the Python tables': every URL scheme a backend table
takes (``stream.brokers.BROKERS``, ``cache.stores.STORES``) is one the schema's
patterns take, and no other; each broker has its KEDA trigger's branch. A broker
added to the table without the chart (or the reverse) fails here, naming the gap.

Another table (the job queue's) is one more row of ``URL_VALUES``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import helm_python as helm
import pytest
import yaml

from serving_core.cache.stores import STORES
from serving_core.stream.brokers import BROKERS
from tests.deploy.chart import CHART, render, tagged

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
STREAM_TEMPLATE = (CHART / "templates" / "_stream.tpl").read_text()

# Each value that holds a backend's URL (its path in values.yaml) -> its table.
URL_VALUES: dict[str, Mapping[str, str]] = {
    "serving.cacheUrl": STORES,
    "stream.source": BROKERS,
    "stream.sink": BROKERS,
    "stream.deadLetter": BROKERS,
}


def schema_of(path: str) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for key in path.split("."):
        node = node["properties"][key]
    return node


def pattern_schemes(pattern: str) -> set[str]:
    """The schemes of a pattern of the form ``^(|(a|b|c)://.+)$``."""
    found = re.fullmatch(r"\^\(\|\((?P<schemes>[a-z0-9+.|-]+)\)://\.\+\)\$", pattern)
    assert found, f"{pattern!r} is not ^(|(SCHEME|...)://.+)$"
    return set(found["schemes"].split("|"))


def define(template: str, name: str) -> str:
    """The body of ``{{- define "NAME" -}} … {{- end }}`` (the define's own end)."""
    found = re.search(
        r'\{\{-? define "' + re.escape(name) + r'" -?\}\}\n(?P<body>.*?)\n\{\{- end \}\}\n\n',
        template + "\n\n",
        re.DOTALL,
    )
    assert found, f"no define {name!r} in the template"
    return found["body"]


STREAM_SCHEMES: dict[str, str] = yaml.safe_load(
    define(STREAM_TEMPLATE, "serving-core.streamSchemes")
)


@pytest.mark.parametrize("value", URL_VALUES)
def test_the_schema_takes_exactly_the_schemes_of_the_values_table(value: str) -> None:
    table = URL_VALUES[value]
    schemes = pattern_schemes(schema_of(value)["pattern"])
    assert schemes == set(table), (
        f"values.schema.json's {value} pattern takes {sorted(schemes)}, the table "
        f"{sorted(table)}: make them equal"
    )


def test_the_templates_scheme_map_has_exactly_the_brokers_schemes() -> None:
    assert set(STREAM_SCHEMES) == set(BROKERS), (
        "_stream.tpl's serving-core.streamSchemes and stream.brokers.BROKERS differ: "
        "give each broker scheme its KEDA broker there"
    )


def test_schemes_of_one_broker_module_are_one_keda_broker_and_no_other() -> None:
    for scheme, module in BROKERS.items():
        same_module = {s for s, m in BROKERS.items() if m == module}
        same_kind = {s for s, k in STREAM_SCHEMES.items() if k == STREAM_SCHEMES[scheme]}
        assert same_module == same_kind, (scheme, same_module, same_kind)


def test_keda_broker_takes_each_broker_of_the_map_and_empty() -> None:
    enum = schema_of("stream.keda.broker")["enum"]
    assert set(enum) == {"", *STREAM_SCHEMES.values()}


@pytest.mark.parametrize("kind", sorted(set(STREAM_SCHEMES.values())))
@pytest.mark.parametrize("name", ["serving-core.streamTrigger", "serving-core.validateStream"])
def test_each_broker_has_its_branch_in_the_trigger_and_its_rules(kind: str, name: str) -> None:
    body = define(STREAM_TEMPLATE, name)
    assert f'eq $broker "{kind}"' in body, f"{name} has no branch for {kind}"


def test_no_stream_template_branches_on_a_scheme_outside_the_map() -> None:
    # No if-chain of schemes: the stream's templates pick by the map (a message may
    # show a URL). The job queue's trigger (_helpers.tpl) is the jobs table's to check.
    for path in (CHART / "templates").glob("*stream*"):
        text = path.read_text()
        if path.name == "_stream.tpl":
            text = text.replace(define(text, "serving-core.streamSchemes"), "")
        for scheme in BROKERS:
            test = rf'(regexMatch|regexFind|hasPrefix|eq|ne|contains)\s+"[^"]*\b{scheme}s?\??:'
            named = re.search(test, text)
            assert not named, f"{path.name}: {named and named.group()}"


@pytest.mark.parametrize("scheme", sorted(BROKERS))
def test_a_plain_source_of_each_scheme_picks_its_brokers_trigger(
    chart: helm.Chart, scheme: str
) -> None:
    url = f"{scheme}://broker.stream.svc/0?queue=in&stream=in"
    keda = {"enabled": True, "authenticationRef": "keda-auth", "stream": "in", "queueName": "in"}
    values = tagged({"stream": {"enabled": True, "keda": keda}})
    values["stream"].update(source=url, sink=url, deadLetter=url)
    docs = render(chart, values)
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    (trigger,) = scaled["spec"]["triggers"]
    kinds = {"amqp": "rabbitmq", "redis": "redis-streams"}
    assert trigger["type"] == kinds.get(STREAM_SCHEMES[scheme], STREAM_SCHEMES[scheme])
