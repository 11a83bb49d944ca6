"""The fenced blocks of README.md and docs/, and a real bash that runs a shell block as a
person would.

The blocks are found by markdown-it (CommonMark), the parser pytest-markdown-docs
uses for the ```python blocks, so both kinds of block are read the same way,
list items included. A block whose info string has ``notest`` (that plugin's
marker, used here for shell blocks too) is an illustration.

A shell block is run by ``Shell``: one ``bash`` process, fed the block's
commands one at a time, so that what a command sets (``. .venv/bin/activate``,
``export``, ``job=$(...)``) holds for the next, as in a terminal. A command
ending in ``&`` starts a server. A block that waits for its servers itself
(a ``curl --retry`` of their health URL, as docs/jobs.md's) is run with no
wait of the runner's, so a block that lacks its wait fails as it would when
pasted whole; for a block whose reader waits (the README's two terminals),
the test says which URL answers once the server is up, and the next command
waits for that, as a person would before typing it.
The commands run as written; only where their output goes is the runner's.
Every process the shell started is stopped when its ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import requests
from markdown_it import MarkdownIt

from tests.servers import ROOT, base_env

README = ROOT / "README.md"
DOCS = ROOT / "docs"
VENV = Path(sys.prefix)  # the suite's own: what `make serve` made
SHELLS = frozenset({"bash", "sh", "shell", "console", "zsh"})
NOTEST = "notest"
COMMAND_TIMEOUT_S = 120.0  # a bound on one command, never an expected time
READY_TIMEOUT_S = 120.0  # a server loading a real model on a loaded 2-core machine
_BACKGROUND = re.compile(r"(?<![&|])&\s*(#.*)?$")


@dataclass(frozen=True)
class Block:
    path: Path
    language: str
    options: frozenset[str]
    text: str
    line: int  # 1-based, the opening fence's

    @property
    def tested(self) -> bool:
        return NOTEST not in self.options

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ```{self.language}"


def pages() -> list[Path]:
    """Every page whose code the suite runs: the README and each page of docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path | None = None) -> list[Block]:
    """The fenced blocks of ``path``, or of every page."""
    if path is None:
        return [block for page in pages() for block in blocks(page)]
    found = []
    for token in MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8")):
        if token.type != "fence" or token.map is None:
            continue
        language, *options = token.info.split() or [""]
        found.append(Block(path, language, frozenset(options), token.content, token.map[0] + 1))
    return found


def shell_blocks(path: Path | None = None) -> list[Block]:
    return [block for block in blocks(path) if block.language in SHELLS]


def block_with(text: str, path: Path | None = None) -> Block:
    """The one shell block that contains ``text``, in ``path`` or in any page."""
    matching = [block for block in shell_blocks(path) if text in block.text]
    where = path.name if path is not None else "README.md and docs/"
    assert len(matching) == 1, f"{len(matching)} shell blocks in {where} contain {text!r}"
    return matching[0]


def commands(text: str) -> list[str]:
    """The block's commands: lines joined across a trailing backslash; no blank or
    comment-only lines."""
    joined: list[str] = []
    pending = ""
    for line in text.splitlines():
        pending += line
        if line.endswith("\\"):
            pending += "\n"
            continue
        if pending.strip() and not pending.lstrip().startswith("#"):
            joined.append(pending)
        pending = ""
    return joined


def project(path: Path) -> Path:
    """A folder standing for a user's checkout: the suite's venv at ``.venv``, nothing else."""
    path.mkdir(parents=True)
    (path / ".venv").symlink_to(VENV)
    return path


# Step 2's model: a user's own, trained elsewhere and saved beside handler.py.
POSITIVE = ["I love it", "great service", "what a wonderful day", "excellent and fast"]
NEGATIVE = ["I hate it", "terrible service", "what an awful day", "slow and broken"]


def put_the_readme_handler(folder: Path) -> None:
    """Step 2 as a user does it: README's handler.py and requirements.txt, and a fitted
    scikit-learn text classifier saved as ``model.joblib`` beside them."""
    import joblib
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    [code] = [b for b in blocks(README) if b.language == "python" and "(Handler):" in b.text]
    (folder / "handler.py").write_text(code.text, encoding="utf-8")
    (folder / "requirements.txt").write_text("scikit-learn\n", encoding="utf-8")
    model = make_pipeline(TfidfVectorizer(), LogisticRegression())
    model.fit(POSITIVE + NEGATIVE, [1] * len(POSITIVE) + [0] * len(NEGATIVE))
    joblib.dump(model, folder / "model.joblib")


@dataclass(frozen=True)
class Ran:
    command: str
    returncode: int
    output: str  # stdout
    errors: str  # stderr (curl's progress meter, when its output is no terminal)


class Shell:
    """One bash session in ``cwd`` (see the module's docstring)."""

    def __init__(self, cwd: Path, env: Mapping[str, str], scratch: Path) -> None:
        self.scratch = scratch
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.count = 0
        self.launched: list[tuple[Path, Path]] = []  # each & command's log and pid file
        self._log = (scratch / "bash.log").open("wb")
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=base_env(env),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            text=True,
            start_new_session=True,
        )

    def _send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def run(self, command: str, timeout_s: float = COMMAND_TIMEOUT_S) -> Ran:
        """Run one foreground command and wait for it to end."""
        self.count += 1
        out, status = self.scratch / f"{self.count}.out", self.scratch / f"{self.count}.status"
        err = out.with_suffix(".err")
        # Braces, not a subshell: what the command sets stays set.
        self._send(f"{{ {command}\n}} > {out} 2> {err}\necho $? > {status}.new\n")
        self._send(f"mv {status}.new {status}\n")
        deadline = time.monotonic() + timeout_s
        while not status.exists():
            if self.process.poll() is not None:
                raise AssertionError(f"bash exited running {command!r}: {self._bash_log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{command!r} still running after {timeout_s} s")
            time.sleep(0.05)
        return Ran(
            command,
            int(status.read_text()),
            out.read_text(errors="replace"),
            err.read_text(errors="replace"),
        )

    def launch(self, command: str) -> tuple[Path, Path]:
        """Run a command that ends in ``&``, as bash does, and wait for nothing; returns
        its log and the file its pid is written to."""
        self.count += 1
        log = self.scratch / f"{self.count}.log"
        pid_file = self.scratch / f"{self.count}.pid"
        in_foreground = _BACKGROUND.sub(lambda m: m.group(1) or "", command)
        self._send(f"{{ {in_foreground}\n}} > {log} 2>&1 &\necho $! > {pid_file}\n")
        self.launched.append((log, pid_file))
        return log, pid_file

    def start(self, command: str, ready_url: str) -> Path:
        """Run a command that ends in ``&`` and wait until ``ready_url`` answers 200;
        returns its log."""
        log, pid_file = self.launch(command)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _answers(ready_url):
            pid = int(pid_file.read_text()) if pid_file.exists() else None
            if pid is not None and not _alive(pid):
                raise AssertionError(f"{command!r} exited:\n{log.read_text(errors='replace')}")
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{ready_url} did not answer after {READY_TIMEOUT_S} s of {command!r}:\n"
                    + log.read_text(errors="replace")
                )
            time.sleep(0.1)
        return log

    def run_block(self, text: str, ready: list[str] | None) -> list[Ran]:
        """Every command of ``text``; the n-th one ending in ``&`` waits for ``ready[n]``,
        or for nothing when ``ready`` is None (the block waits for its servers itself)."""
        ran = []
        waits = iter(ready or [])
        for command in commands(text):
            if _BACKGROUND.search(command) and ready is None:
                self.launch(command)
            elif _BACKGROUND.search(command):
                self.start(command, next(waits))
            else:
                ran.append(self.run(command))
        assert next(waits, None) is None, "fewer servers started than expected"
        return ran

    def server_logs(self) -> str:
        """What each command started with ``&`` printed so far, for a failure's message."""
        return "".join(
            f"--- {log.name} ---\n{log.read_text(errors='replace')[-4000:]}\n"
            for log, _ in self.launched
            if log.exists()
        )

    def close(self) -> None:
        """SIGTERM to everything the shell started; SIGKILL to what is left after 30 s."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        pids = [int(t) for _, p in self.launched if p.exists() and (t := p.read_text().strip())]
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        if self.process.stdin is not None:
            self.process.stdin.close()
        self._log.close()

    def _bash_log(self) -> str:
        return (self.scratch / "bash.log").read_text(errors="replace")


@contextlib.contextmanager
def shell(cwd: Path, env: Mapping[str, str], scratch: Path) -> Iterator[Shell]:
    session = Shell(cwd, env, scratch)
    try:
        yield session
    finally:
        session.close()


def _answers(url: str) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(url, timeout=1).status_code == 200
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (ended, not yet reaped by its new parent) is gone too.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False
