"""The chart README's examples: what it shows is what the chart renders."""

from __future__ import annotations

import re

import helm_python as helm
import yaml

from tests.deploy.chart import (
    CHART,
    POD_KNOBS,
    VALUE_SETS,
    find,
    is_subset,
    render,
)

# --- documentation ---------------------------------------------------------------


def test_readme_shows_what_the_custom_handler_example_renders(chart: helm.Chart) -> None:
    readme = (CHART / "README.md").read_text()
    block = re.search(
        r"<!-- rendered: examples/values-custom-handler.yaml -->\n```yaml\n(.*?)```", readme, re.S
    )
    assert block, "README.md lost the rendered custom-handler Deployment"
    expected = yaml.safe_load(block.group(1))
    deployment = find(render(chart, VALUE_SETS["values-custom-handler"]), "Deployment")
    assert is_subset(expected, deployment) == []


def test_readme_shows_the_custom_handler_example_as_it_is() -> None:
    readme = (CHART / "README.md").read_text()
    block = re.search(
        r"<!-- example: examples/values-custom-handler.yaml -->\n```yaml\n(.*?)```", readme, re.S
    )
    assert block, "README.md lost the custom-handler example"
    assert yaml.safe_load(block.group(1)) == VALUE_SETS["values-custom-handler"]


def test_readme_documents_every_pod_knob() -> None:
    readme = (CHART / "README.md").read_text()
    knobs = [key for key in POD_KNOBS if key != "image"] + ["networkPolicy", "envFrom"]
    assert [k for k in knobs if f"`{k}" not in readme] == []
