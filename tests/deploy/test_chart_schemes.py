"""The chart's scheme lists are the Python tables': every URL scheme a backend table
takes (``stream.brokers.BROKERS``, ``cache.stores.STORES``, ``jobs.backends.BACKENDS``)
is one the schema's patterns take, and no other (an empty URL is every pattern's first
alternative; ``NOT_OFFERED`` says why the chart leaves a scheme out); each broker and
each job backend has its KEDA trigger's branch. A backend added to a table without the
chart (or the reverse) fails here, naming the gap.

Another table is one more row of ``URL_VALUES``.
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
from serving_core.jobs import backends
from serving_core.jobs.backends import BACKENDS
from serving_core.stream.brokers import BROKERS
from tests.deploy.chart import CHART, render, tagged, with_worker

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
STREAM_TEMPLATE = (CHART / "templates" / "_stream.tpl").read_text()
WORKER_TEMPLATE = (CHART / "templates" / "_worker.tpl").read_text()

# Each value that holds a backend's URL (its path in values.yaml) -> its table.
URL_VALUES: dict[str, Mapping[str, str]] = {
    "serving.cacheUrl": STORES,
    "stream.source": BROKERS,
    "stream.sink": BROKERS,
    "stream.deadLetter": BROKERS,
    "serving.jobsUrl": BACKENDS,
}

# Schemes a table takes that a value's pattern leaves out on purpose, and why.
NOT_OFFERED: dict[str, dict[str, str]] = {
    "serving.jobsUrl": {
        # jobs/sqlite/backend.py takes "sqlite://" and nothing after it: the empty URL
        # spelled again, which validateWorker and the networkPolicy rule would each
        # have to tell from a shared queue's URL.
        "sqlite": "the empty jobsUrl: a SQLite file in each pod",
    },
}


def offered(value: str) -> set[str]:
    """The schemes ``value``'s pattern should take: its table's, less the empty URL
    (the pattern's own first alternative) and those ``NOT_OFFERED``."""
    return set(URL_VALUES[value]) - {""} - set(NOT_OFFERED.get(value, {}))


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
JOBS_SCHEMES: dict[str, str] = yaml.safe_load(define(WORKER_TEMPLATE, "serving-core.jobsSchemes"))
# The job queue's templates: none may pick by scheme but through JOBS_SCHEMES.
JOBS_TEMPLATES = ("_worker.tpl", "worker.yaml", "scaledobject.yaml")


@pytest.mark.parametrize("value", URL_VALUES)
def test_the_schema_takes_exactly_the_schemes_of_the_values_table(value: str) -> None:
    schemes = pattern_schemes(schema_of(value)["pattern"])
    assert schemes == offered(value), (
        f"values.schema.json's {value} pattern takes {sorted(schemes)}, the table "
        f"{sorted(offered(value))} (less NOT_OFFERED): make them equal"
    )


@pytest.mark.parametrize(
    ("value", "scheme"), [(v, s) for v, schemes in NOT_OFFERED.items() for s in schemes]
)
def test_a_scheme_the_chart_leaves_out_is_the_empty_url_again(value: str, scheme: str) -> None:
    table = URL_VALUES[value]
    assert scheme in table, f"NOT_OFFERED[{value!r}] names {scheme}, which the table lost"
    assert table[scheme] == table[""], (
        f"{scheme}:// is no longer the empty URL's backend: offer it in {value}'s pattern"
    )


def test_sqlite_url_is_exactly_the_empty_one() -> None:
    # Why the pattern cannot take it as sqlite://.+ like the others.
    backend = backends.backend_for("sqlite://")
    assert backend is backends.backend_for("")
    backend.check_url("sqlite://")
    with pytest.raises(ValueError, match="SERVING_JOBS_PATH"):
        backend.check_url("sqlite:///var/lib/jobs.db")


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
    # show a URL).
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
    url = f"{scheme}://broker.stream.svc:9999/0?queue=in&stream=in"
    keda = {"enabled": True, "authenticationRef": "keda-auth", "stream": "in", "queueName": "in"}
    values = tagged({"stream": {"enabled": True, "keda": keda}})
    values["stream"].update(source=url, sink=url, deadLetter=url)
    docs = render(chart, values)
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    (trigger,) = scaled["spec"]["triggers"]
    kinds = {"amqp": "rabbitmq", "redis": "redis-streams"}
    assert trigger["type"] == kinds.get(STREAM_SCHEMES[scheme], STREAM_SCHEMES[scheme])


def test_the_jobs_scheme_map_has_exactly_the_schemes_the_schema_offers() -> None:
    assert set(JOBS_SCHEMES) == offered("serving.jobsUrl"), (
        "_worker.tpl's serving-core.jobsSchemes and jobs.backends.BACKENDS (less the "
        "empty URL and NOT_OFFERED) differ: give each job backend's scheme its KEDA scaler"
    )


def test_schemes_of_one_job_backend_are_one_keda_scaler_and_no_other() -> None:
    for scheme, scaler in JOBS_SCHEMES.items():
        same_backend = {s for s in JOBS_SCHEMES if BACKENDS[s] == BACKENDS[scheme]}
        same_scaler = {s for s, k in JOBS_SCHEMES.items() if k == scaler}
        assert same_backend == same_scaler, (scheme, same_backend, same_scaler)


def test_a_url_in_a_secret_has_the_one_scaler_of_every_scheme() -> None:
    # jobsScaler cannot read serving.jobsUrlSecret's URL, so it takes the map's one
    # scaler. A second needs a worker.keda value naming it, as stream.keda.broker.
    assert len(set(JOBS_SCHEMES.values())) == 1, (
        "jobsSchemes has more than one KEDA scaler: add a worker.keda value that names "
        "it for a URL in serving.jobsUrlSecret, and use it in serving-core.jobsScaler"
    )


@pytest.mark.parametrize("scaler", sorted(set(JOBS_SCHEMES.values())))
@pytest.mark.parametrize("name", ["serving-core.jobsTrigger", "serving-core.validateWorker"])
def test_each_scaler_has_its_branch_in_the_trigger_and_its_rules(scaler: str, name: str) -> None:
    body = define(WORKER_TEMPLATE, name)
    assert f'eq $scaler "{scaler}"' in body, f"{name} has no branch for {scaler}"


def test_no_jobs_template_branches_on_a_scheme_outside_the_map() -> None:
    for name in JOBS_TEMPLATES:
        text = (CHART / "templates" / name).read_text()
        if name == "_worker.tpl":
            text = text.replace(define(text, "serving-core.jobsSchemes"), "")
        for scheme in set(BACKENDS) - {""}:
            test = rf'(regexMatch|regexFind|hasPrefix|eq|ne|contains)\s+"[^"]*\b{scheme}s?\??:'
            named = re.search(test, text)
            assert not named, f"{name}: {named and named.group()}"


@pytest.mark.parametrize("scheme", sorted(JOBS_SCHEMES))
def test_a_plain_jobs_url_of_each_scheme_picks_its_scalers_trigger(
    chart: helm.Chart, scheme: str
) -> None:
    url = f"{scheme}://redis.queue.svc:6379/0"
    # A URL with no host KEDA can reach (a unix socket's) needs the address.
    keda = {"enabled": True, "address": "redis.queue.svc:6379"}
    values = with_worker({"serving": {"jobsUrl": url}}, queue="minilm", keda=keda)
    (scaled,) = [d for d in render(chart, values) if d["kind"] == "ScaledObject"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == JOBS_SCHEMES[scheme]
