"""A Dockerfile read as the builder reads it: stages of instructions, continuation
lines joined, comments dropped, ${ARG} defaults known. Enough for the offline
tests to reason about what a build copies and runs, in which order."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

# ${NAME}, ${NAME:-word} (word when NAME is unset or empty), ${NAME:+word} (word
# when NAME is set and not empty, else empty): the forms Dockerfiles take.
VARIABLE = re.compile(r"\$\{(\w+)(?::([-+])([^}]*))?\}")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: COPY, RUN, ARG ...
    text: str  # everything after the keyword, continuations joined

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text, comments=False, posix=True)

    def copy_sources(self) -> list[str]:
        """COPY's sources (the last word is the destination), flags left out."""
        words = [w for w in self.words if not w.startswith("--")]
        return words[:-1]

    def copy_destination(self) -> str:
        return self.words[-1]


@dataclass
class Stage:
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def args(self) -> dict[str, str]:
        """The stage's ARG defaults (an ARG without one maps to "")."""
        found = {}
        for instruction in self.of("ARG"):
            name, _, default = instruction.text.partition("=")
            found[name.strip()] = default.strip()
        return found

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def index(self, instruction: Instruction) -> int:
        return self.instructions.index(instruction)


def parse(path: Path) -> list[Stage]:
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical:
        keyword, _, text = line.partition(" ")
        instruction = Instruction(keyword.upper(), text.strip())
        if instruction.keyword == "FROM":
            stages.append(Stage(base=instruction.text))
        elif stages:
            stages[-1].instructions.append(instruction)
    return stages


def expand(text: str, values: dict[str, str]) -> str:
    """${NAME} replaced from ``values``, repeatedly (a default may name another ARG);
    a plain ${NAME} not in ``values`` is left as it is, ``:-`` and ``:+`` read it as empty."""

    def value(found: re.Match[str]) -> str:
        name, operator, word = found.groups()
        if operator is None:
            return values.get(name, found.group(0))
        given = values.get(name, "")
        if operator == "-":
            return given or word
        return word if given else ""

    for _ in range(5):
        text = VARIABLE.sub(value, text)
    return text
