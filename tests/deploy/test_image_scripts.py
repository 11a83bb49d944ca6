"""Every script an image runs is committed executable.

A build's COPY keeps a file's mode as git checked it out, so a script committed
100644 becomes a file the container cannot execute: an ENTRYPOINT that fails
with "permission denied", or a hook a base image skips as "not executable"
(what once left the nginx image without a configuration). The scripts are
found from the Dockerfiles themselves: what their COPY instructions bring in
from the build context (the Dockerfile's folder) that the image then runs
(ENTRYPOINT, CMD, HEALTHCHECK, RUN), and every copied file that starts with
``#!``.
"""

from __future__ import annotations

import json
import posixpath
import re
import subprocess
from dataclasses import dataclass
from pathlib import PurePosixPath

import pytest

from tests.container.dockerfile import Instruction, Stage, expand, parse
from tests.servers import ROOT, git_ls_files

# Where a bare command name is looked up in the images (Debian's and alpine's PATH).
PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
WORD = re.compile(r"[^\s;|&()<>'\"`]+")


def git_modes() -> dict[str, str]:
    """Each tracked file's mode as git records it (100644, 100755, 120000 ...)."""
    modes = {}
    for entry in git_ls_files("-s"):
        meta, _, path = entry.partition("\t")
        modes[path] = meta.split()[0]
    return modes


def dockerfiles(modes: dict[str, str]) -> list[str]:
    def is_dockerfile(path: PurePosixPath) -> bool:
        return path.name in {"Dockerfile", "Containerfile"} or path.suffix in {
            ".Dockerfile",
            ".Containerfile",
        }

    return sorted(p for p in modes if is_dockerfile(PurePosixPath(p)))


@dataclass(frozen=True)
class Copied:
    source: str  # the file in the repository
    destination: str  # its absolute path in the image


def copied_files(dockerfile: str, stage: Stage, tracked: set[str]) -> list[Copied]:
    """The repository's files each COPY (or ADD) of ``stage`` puts in the image, and where."""
    context = PurePosixPath(dockerfile).parent
    args = stage.args()
    workdir = "/"
    found = []
    for instruction in stage.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = posixpath.join(workdir, expand(instruction.text, args))
            continue
        if instruction.keyword not in {"COPY", "ADD"} or "--from=" in instruction.text:
            continue
        written_destination = expand(instruction.copy_destination(), args)
        destination = posixpath.normpath(posixpath.join(workdir, written_destination))
        sources = instruction.copy_sources()
        into_folder = written_destination.endswith("/") or len(sources) > 1
        for written in sources:
            source = posixpath.normpath(expand(written, args))
            if "$" in source or "*" in source:
                continue  # an ARG without a default, or a glob: nothing certain to check
            in_repo = posixpath.normpath(context / source)
            prefix = "" if in_repo == "." else in_repo + "/"
            below = [] if in_repo in tracked else sorted(p for p in tracked if p.startswith(prefix))
            if below:  # a folder: its contents go under the destination
                found += [Copied(p, posixpath.join(destination, p[len(prefix) :])) for p in below]
            elif in_repo in tracked:
                target = posixpath.join(destination, posixpath.basename(in_repo))
                found.append(Copied(in_repo, target if into_folder else destination))
    return found


def programs(instruction: Instruction) -> list[str]:
    """The words of an ENTRYPOINT, CMD, HEALTHCHECK or RUN that may name a program.

    Split on blanks, quotes and shell operators alone: a shell script's words
    (``sh -c "..."``, a RUN) are candidates too, and nothing has to parse.
    """
    text = instruction.text
    if instruction.keyword == "HEALTHCHECK":
        text = text.partition("CMD ")[2]
    parts = json.loads(text) if text.lstrip().startswith("[") else [text]
    return [word for part in parts for word in WORD.findall(part)]


def run_by_the_image(stage: Stage, copied: list[Copied]) -> set[str]:
    at = {c.destination: c.source for c in copied}
    runs = ["ENTRYPOINT", "CMD", "HEALTHCHECK", "RUN"]
    found = set()
    for instruction in (i for i in stage.instructions if i.keyword in runs):
        for word in programs(instruction):
            candidates = [word] if word.startswith("/") else [f"{d}/{word}" for d in PATH]
            found |= {at[c] for c in candidates if c in at}
    return found


def shebang(path: str) -> bool:
    with (ROOT / path).open("rb") as file:
        return file.read(2) == b"#!"


def image_scripts() -> dict[str, set[str]]:
    """Each script an image runs or that looks runnable, with the Dockerfiles that copy it."""
    modes = git_modes()
    tracked = {p for p, mode in modes.items() if mode != "160000"}  # no submodules
    scripts: dict[str, set[str]] = {}
    for dockerfile in dockerfiles(modes):
        for stage in parse(ROOT / dockerfile):
            copied = copied_files(dockerfile, stage, tracked)
            run = run_by_the_image(stage, copied)
            run |= {c.source for c in copied if (ROOT / c.source).is_file() and shebang(c.source)}
            for path in run:
                scripts.setdefault(path, set()).add(dockerfile)
    return scripts


def test_the_known_scripts_are_found_from_their_dockerfiles() -> None:
    # The search below is only as good as what it finds: it must see the
    # scripts we know every container, or every app image build, runs.
    found = image_scripts()
    assert found["nginx/entrypoint.sh"] == {"nginx/Dockerfile"}
    assert found["docker/install-system-packages.sh"] == {"Dockerfile"}


def test_every_shell_script_an_image_runs_passes_shellcheck() -> None:
    # /bin/sh in the images: busybox ash (alpine) or dash (Debian), POSIX only.
    scripts = sorted(s for s in image_scripts() if s.endswith(".sh"))
    assert scripts
    result = subprocess.run(
        ["shellcheck", "--shell=sh", *scripts],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script", sorted(image_scripts()))
def test_every_script_an_image_runs_is_committed_executable(script: str) -> None:
    mode = git_modes()[script]
    assert mode == "100755", (
        f"{script} is committed as {mode}, so the image cannot execute it: "
        f"git update-index --chmod=+x {script} && chmod +x {script}"
    )
