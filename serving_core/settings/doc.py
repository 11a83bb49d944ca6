"""The settings reference: ``docs/settings.md``'s table, generated from ``Settings``.

Each row is one field: its variable, its default (in words where ``from_env``
resolves it), what its parser accepts, and its doc. ``python -m
serving_core.settings.doc`` rewrites the table between the file's markers and
leaves the prose around them alone; ``--check`` only says whether the table is
current (tests/test_settings.py fails when it is not).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serving_core.settings.parsers import spec
from serving_core.settings.table import PREFIX, Settings

START = "<!-- settings-table:start -->"
END = "<!-- settings-table:end -->"
DOC = Path("docs/settings.md")  # from the repository's root
HEADER = "| variable | default | accepts | meaning |\n| --- | --- | --- | --- |\n"


def _default(value: Any) -> str:
    if value in ("", ()):
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    if isinstance(value, tuple):
        return f"`{','.join(value)}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    # A | would end the cell; a line break would end the row.
    return text.replace("|", "\\|").replace("\n", " ")


def table(settings: type[Any] = Settings) -> str:
    """The markdown table of ``settings``' fields, each declared with ``setting()``."""
    rows = []
    for field in dataclasses.fields(settings):
        about = spec(field)  # a field without a parser or a doc stops here, named
        default = about.shown or _default(field.default)
        cells = (f"`{PREFIX}{field.name.upper()}`", default, about.parser.accepts, about.doc)
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |\n")
    return HEADER + "".join(rows)


def with_table(text: str, generated: str) -> str:
    """``text`` with ``generated`` between the markers, which must be there once each."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"the file needs one {START} line, then one {END} line")
    head, rest = text.split(START)
    _, tail = rest.split(END)
    # Blank lines around the table: a renderer may take a table that touches an
    # HTML comment for part of the comment's raw HTML block.
    return f"{head}{START}\n\n{generated}\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serving_core.settings.doc", description=__doc__.split("\n")[0]
    )
    parser.add_argument("path", nargs="?", type=Path, default=DOC)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    text = args.path.read_text(encoding="utf-8")
    current = with_table(text, table())
    if current == text:
        return 0
    if args.check:
        print(f"{args.path}: the settings table is stale; run {parser.prog}", file=sys.stderr)
        return 1
    args.path.write_text(current, encoding="utf-8")
    print(f"{args.path}: the settings table is rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
