"""A handler whose "weights" are a text file in ``self.model_dir``: it answers with
them and the revision serving-core handed it, so a test sees which copy it serves."""

from __future__ import annotations

from typing import Any

from serving_core import Handler


class Artifacts(Handler):
    name = "artifacts"

    def setup(self) -> None:
        assert self.model_dir is not None, "SERVING_MODEL_URI is unset"
        self.weights = (self.model_dir / "weights.txt").read_text()
        self.files = sorted(
            str(path.relative_to(self.model_dir))
            for path in self.model_dir.rglob("*")
            if path.is_file()
        )

    def predict(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "weights": self.weights,
            "files": self.files,
            "revision": self.artifacts_revision,
            "dir": str(self.model_dir),
        }
