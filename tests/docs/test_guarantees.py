"""docs/guarantees.md names, for each promise, the test that backs it: each one named must
exist, and every line of its tables must name one or say it is a stated assumption."""

from __future__ import annotations

import ast
import re

from tests.servers import ROOT

PAGE = ROOT / "docs" / "guarantees.md"
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def test_every_test_the_guarantees_page_names_exists():
    named = NAMED.findall(PAGE.read_text())
    assert len(named) >= 15
    missing = []
    for path, name in set(named):
        tree = ast.parse((ROOT / path).read_text())
        functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        if name not in functions:
            missing.append(f"{path}::{name}")
    assert missing == []


def test_every_row_of_the_guarantees_tables_is_backed_or_an_assumption():
    rows = [
        line
        for line in PAGE.read_text().splitlines()
        if line.startswith("| ")
        and not line.startswith(("| event", "| Redis setting", "| promise", "| rerun", "| ---"))
    ]
    unbacked = [row for row in rows if not NAMED.search(row) and "stated assumption" not in row]
    assert rows
    assert unbacked == [], "name the test, or say **stated assumption**"
