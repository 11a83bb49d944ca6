"""Weights baked into the app image (MODEL_DIR) sit in a layer of their own.

The image is built twice, each time from a scratch build context with the same
generated weights written afresh (new modification times, as a fresh checkout
or download has) and a handler whose handler.py alone differs: the weights
layer's digest is the same both times, so a push after a code edit sends no
weights again, while the code's layer differs. The second build reuses the
layer from the engine's cache, which keys a COPY by its files' contents and
everything above it; a layer rebuilt without the cache would differ (the
builder stamps /models with the build's time). The baked image points
SERVING_MODEL_URI at the folder, which the serving user can read; the image
built without MODEL_DIR bakes nothing and names no model.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from serving_core.settings import Settings
from tests.container import bases
from tests.container.context import app_context
from tests.container.engine import Engine
from tests.container.images import REPORT, build_timed, torch_index_args

pytestmark = [pytest.mark.e2e, pytest.mark.container, pytest.mark.timeout(1800)]

HANDLER_DIR = "handlers/baked"
MODEL_DIR = "models/baked"
BAKED = "/models"
HANDLER = '''"""Answers with its version: the one line the two builds differ by."""

from typing import Any

from serving_core import Handler

VERSION = {version}


class Baked(Handler):
    def predict(self, params: dict[str, Any]) -> dict[str, Any]:
        return {{"version": VERSION, "echo": params}}
'''
SAMPLE = '{"text": "hello"}\n'


def weights() -> dict[str, bytes]:
    """A few MB of model artifacts: generated, the same bytes on every call."""
    generated = random.Random(40)
    return {
        f"{MODEL_DIR}/model.safetensors": generated.randbytes(4 * 1024 * 1024),
        f"{MODEL_DIR}/config.json": b'{"hidden_size": 384}\n',
        f"{MODEL_DIR}/tokenizer/vocab.txt": b"[PAD]\n[UNK]\nhello\n",
    }


def context(tmp: Path, version: int) -> Path:
    """A scratch build context: the handler at ``version`` and the weights."""
    return app_context(
        tmp,
        {
            f"{HANDLER_DIR}/handler.py": HANDLER.format(version=version),
            f"{HANDLER_DIR}/sample.json": SAMPLE,
            **weights(),
        },
    )


@dataclass(frozen=True)
class Built:
    tag: str
    layers: list[tuple[str, str]]  # (the step, its digest), base first

    def layer_copied_to(self, destination: str) -> str:
        """The digest of the layer the COPY into ``destination`` made."""
        found = [digest for step, digest in self.layers if copies_to(step, destination)]
        assert len(found) == 1, f"{self.tag}: {len(found)} COPY layers into {destination}"
        return found[0]

    def index_of(self, digest: str) -> int:
        return [d for _, d in self.layers].index(digest)


def copies_to(step: str, destination: str) -> bool:
    """Whether ``step`` (as podman or docker records it) is a COPY into ``destination``."""
    words = step.replace("# buildkit", "").split()
    return "COPY" in words and words[-1].rstrip("/") == destination.rstrip("/")


@pytest.fixture(scope="module")
def baked(
    engine: Engine, python_base: bases.Resolved, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Built, Built]:
    built = []
    for version in (1, 2):
        tag = f"serving-core-test:app-baked-{version}"
        build_timed(
            engine,
            f"app image ({HANDLER_DIR}, MODEL_DIR={MODEL_DIR}, handler version {version})",
            context(tmp_path_factory.mktemp(f"baked-{version}"), version),
            tag,
            build_args={"HANDLER_DIR": HANDLER_DIR, "MODEL_DIR": MODEL_DIR, **torch_index_args()},
            build_contexts=python_base.build_contexts(),
        )
        built.append(Built(tag, engine.image_layers(tag)))
    first, second = built
    for image in built:
        REPORT.append(
            f"{image.tag}: weights layer {image.layer_copied_to(BAKED)}, "
            f"code layer {image.layer_copied_to('/app')}"
        )
    return first, second


def test_an_edit_to_handler_py_leaves_the_weights_layer_as_it_was(
    baked: tuple[Built, Built],
) -> None:
    first, second = baked
    weights_layer = first.layer_copied_to(BAKED)
    assert second.layer_copied_to(BAKED) == weights_layer
    # Dependencies, then weights, then code: everything up to the weights is shared,
    # and the code's layer (and what follows it) is the edit's alone.
    at = first.index_of(weights_layer)
    assert second.index_of(weights_layer) == at
    assert [d for _, d in first.layers[: at + 1]] == [d for _, d in second.layers[: at + 1]]
    assert first.layer_copied_to("/app") != second.layer_copied_to("/app")
    assert first.index_of(first.layer_copied_to("/opt/venv")) < at
    assert at < first.index_of(first.layer_copied_to("/app"))
    assert at < first.index_of(first.layer_copied_to("/tmp/wheels"))


def test_the_baked_image_names_its_weights_which_the_serving_user_reads(
    engine: Engine, baked: tuple[Built, Built]
) -> None:
    first, _ = baked
    env = engine.image_env(first.tag)
    assert env["SERVING_MODEL_URI"] == BAKED
    assert Settings.from_env(env, cores=2).model_uri == BAKED
    # As the image's user (uid 10001), every file with its bytes, and nothing else.
    listing = (
        "import hashlib, json, pathlib; root = pathlib.Path('/models'); "
        "print(json.dumps({str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() "
        "for p in root.rglob('*') if p.is_file()}))"
    )
    result = engine.call("run", "--rm", first.tag, "python", "-c", listing)
    expected = {
        path.removeprefix(MODEL_DIR + "/"): hashlib.sha256(content).hexdigest()
        for path, content in weights().items()
    }
    assert json.loads(result.stdout) == expected


def test_the_image_built_without_model_dir_bakes_nothing_and_names_no_model(
    engine: Engine, app_image: str
) -> None:
    env = engine.image_env(app_image)
    # Empty means none: the chart's model.uri or compose names a store instead.
    assert env.get("SERVING_MODEL_URI", "") == ""
    assert Settings.from_env(env, cores=2).model_uri == ""
    result = engine.call("run", "--rm", app_image, "ls", "-A", BAKED)
    assert result.stdout.strip() == ""
