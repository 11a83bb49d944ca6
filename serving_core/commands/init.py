"""``serving-core init NAME``: a new handler folder that serves and passes ``check`` as written.

The files are kept here as text rather than as package data so that the
skeleton a user starts from can be read in one place, next to the code that
writes it. The skeleton runs as it is (a trivial "model"), so ``make test``
stays green from the first minute and every later edit is checked.
"""

from __future__ import annotations

import re
from pathlib import Path

from serving_core.commands.failure import Failure

NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")

HANDLER = '''\
"""$title: served by serving-core.

Run it:    SERVING_HANDLER=$folder make serve
Check it:  serving-core check $folder    (runs sample.json; `make test` does too)
"""

from __future__ import annotations

from typing import Any

from serving_core import Handler, InvalidInput


class $cls(Handler):
    # Shown in /metadata and the logs. Change `version` whenever the model or
    # its output changes: caches key on name + version.
    name = "$name"
    version = "1"

    # JSON Schema of one request's parameters (the JSON body, form fields and
    # query string, merged into one dict). A request that breaks it gets a 400
    # naming the field, before your code runs; /openapi.json shows it.
    input_schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1, "maxLength": 10_000}},
        "required": ["text"],
    }

    def setup(self) -> None:
        """Load the model once, in the gunicorn master, before the workers fork:
        they share its memory. Load on the CPU here even for a GPU (no CUDA before
        fork); move it in setup_worker() (see serving_core.device)."""
        # e.g. self.model = joblib.load(Path(__file__).parent / "model.joblib")
        self.model = len  # a stand-in "model": replace it with yours

    def setup_worker(self) -> None:
        """Once per worker, after fork: per-process state, moving the model to a GPU."""

    def predict_batch(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One call for up to SERVING_MAX_BATCH_SIZE requests, on the worker's model
        thread. Return exactly one dict per input, in order (numpy arrays inside are
        fine). Raise InvalidInput (or put one in an item's place) for a bad item: that
        request alone gets a 400."""
        texts = [params["text"] for params in batch]
        if any(not text.strip() for text in texts):
            raise InvalidInput("text must contain more than whitespace")
        return [{"length": self.model(text)} for text in texts]
'''

SAMPLE = '{"text": "serving-core makes this a service."}\n'

REQUIREMENTS = """\
# What this handler needs beyond serving-core. It is installed by `make serve`,
# `make test` and the image build under serving-core's constraints.txt, so
# torch and friends resolve to the versions serving-core is tested with (and
# the image's torch index decides CPU or CUDA builds). Add e.g.:
# scikit-learn
# torch
"""


class ScaffoldError(Exception):
    """The handler cannot be created; the message says why and what to do."""


def create(name: str, parent: Path) -> Path:
    """Write ``parent/name/`` with ``handler.py``, ``sample.json`` and ``requirements.txt``."""
    if not NAME.fullmatch(name):
        raise ScaffoldError(
            f"{name!r} is not a handler name; use lower case letters, digits, '-' and '_', "
            "starting with a letter (e.g. sentiment, image-classifier)"
        )
    folder = parent / name
    if folder.exists():
        raise ScaffoldError(f"{folder} already exists; pick another name or remove it first")
    words = re.split(r"[-_]", name)
    cls = "".join(word.capitalize() for word in words if word)
    text = (
        HANDLER.replace("$title", " ".join(words).capitalize())
        .replace("$folder", str(folder))
        .replace("$cls", cls)
        .replace("$name", name)
    )
    folder.mkdir(parents=True)
    (folder / "handler.py").write_text(text, encoding="utf-8")
    (folder / "sample.json").write_text(SAMPLE, encoding="utf-8")
    (folder / "requirements.txt").write_text(REQUIREMENTS, encoding="utf-8")
    return folder


def main(name: str, parent: Path) -> int:
    """Create the handler and print what to run next."""
    try:
        folder = create(name, parent)
    except (ScaffoldError, OSError) as exc:
        raise Failure(str(exc)) from exc
    steps = [
        (f"serving-core check {folder}", "run its sample.json (make test does too)"),
        (f"SERVING_HANDLER={folder} make serve", "serve it on 127.0.0.1:8000"),
        (f"make image HANDLER_DIR={folder}", "build its image"),
    ]
    width = max(len(command) for command, _ in steps)
    print(f"created {folder}/: handler.py, sample.json, requirements.txt")
    for command, why in steps:
        print(f"  {command:<{width}}  # {why}")
    return 0
